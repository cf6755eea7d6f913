"""What `servelab plan` prints and writes: which cost model prices the probes, each GPU's
engine settings, the cheapest deployments' tables, and the CSVs and chart of `--out`."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from servelab.sweeps.deployment_search import Family, SearchContext, engine_settings
from servelab.sweeps.grid import CapacitySlo
from sim.cost.gpu_terms import coverage as gpu_coverage
from sim.cost.kernel_cost import KernelCostModel

_TABLE = ("deployment", "engines", "gpus", "max_num_seqs", "max_num_batched_tokens",
          "usd_per_hour", "p99_ttft_ms", "p99_itl_ms", "max_rate_rps")


COST_NAMES = {"auto": "vllm-kernels where the GPU has tables, else gpu-fitted",
              "kernels": "vllm-kernels", "gpu": "gpu-fitted", "roofline": "roofline"}


def cost_name(cost: str) -> str:
    return COST_NAMES[cost]


def engines_per_hardware(context: SearchContext, families: list[Family]
                          ) -> dict[str, list[dict]]:
    """Each GPU's distinct engine settings among the families (vLLM's defaults for that GPU
    where a limit was not given), as the probes run them."""
    engines: dict[str, list[dict]] = {}
    for family in families:
        settings = engine_settings(context.scheduler_config(family))
        if settings not in engines.setdefault(family.hardware, []):
            engines[family.hardware].append(settings)
    return engines


def print_engines(engines: dict[str, list[dict]]) -> None:
    print("engine per GPU (limits not given are vLLM's defaults for that GPU):")
    for hardware, rows in sorted(engines.items()):
        for row in rows:
            print(f"  {hardware}: max_num_seqs {row['max_num_seqs']}, max_num_batched_tokens "
                  f"{row['max_num_batched_tokens']}, max_model_len {row['max_model_len']}")


def print_pricing(context: SearchContext, engines: dict[str, list[dict]],
                   families: list[Family]) -> None:
    """Which cost model prices the probes: per GPU the measured kernels' tables, or whether
    the GPU lies in the fitted model's data."""
    print(f"priced by {cost_name(context.cost)}")
    if context.speculative is not None:
        record = context.speculative.as_record()
        print(f"  speculative decoding on every engine: {json.dumps(record)}")
    if context.cost == "roofline":
        return
    for hardware, rows in sorted(engines.items()):
        family = next(f for f in families if f.hardware == hardware)
        model = context.resolved(family).cost_model
        if isinstance(model, KernelCostModel):
            print(f"  GPU {hardware}: {model.describe()}")
            continue
        # Its engines compute at most their token budget a step.
        budget = max(row["max_num_batched_tokens"] for row in rows)
        print(f"  {gpu_coverage(context.model, hardware, budget)}")


def mark_unsearched(top: list[dict], best: list[dict]) -> None:
    """Rows of `top` whose highest rate was not searched (only each GPU's cheapest is) say
    which deployment they are dearer than instead of a missing number."""
    cheapest_of = {row["hardware"]: row for row in best}
    for row in top:
        if "max_rate_rps" not in row:
            other = cheapest_of[row["hardware"]]
            row["max_rate_rps"] = (
                f"not searched (dearer than {other['deployment']})"
                if row["usd_per_hour"] > other["usd_per_hour"] else
                f"not searched (as dear as {other['deployment']}, whose p99 TTFT is lower)")


def print_plan(trace, slo: CapacitySlo, best: list[dict], top: list[dict], counts: dict) -> None:
    print(f"plan for {trace.name}: {len(trace)} requests at {len(trace) / trace.span_s:.2f} "
          f"req/s; p99 TTFT <= {slo.ttft_p99_ms:g} ms, p99 ITL <= {slo.itl_p99_ms:g} ms; "
          f"{counts['started']} simulations started, {counts['stopped']} stopped early "
          f"(certain to miss the SLO), {counts['skipped']} skipped")
    if not best:
        print("no deployment in the search space holds the SLO")
        return
    print("\ncheapest per GPU type (max_rate_rps: the highest rate it holds the SLO at):")
    print(_table(best))
    print(f"\ncheapest {len(top)} overall:")
    print(_table(top))


def _table(rows: list[dict]) -> str:
    frame = pd.DataFrame(rows)
    if "max_rate_rps" in frame:  # a number, or why there is none
        frame["max_rate_rps"] = [f"{v:.4g}" if isinstance(v, float) else v
                                 for v in frame["max_rate_rps"]]
    columns = [c for c in _TABLE if c in frame]
    return frame[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}")


def write_plan_out(out_dir: Path, probes: list[dict], best: list[dict], slo: CapacitySlo,
               title: str) -> None:
    from servelab.reporting.charts.plan_chart import plan_chart

    out_dir.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(probes)
    table.to_csv(out_dir / "plan_probes.csv", index=False)
    pd.DataFrame(best).to_csv(out_dir / "plan_cheapest.csv", index=False)
    # A probe stopped early has no p99 to plot (only its requests done by then had one).
    ran = table[table["stopped_s"].isna()] if "stopped_s" in table else table
    path = plan_chart(ran, pd.DataFrame(best), slo.ttft_p99_ms, out_dir, title)
    print(f"wrote plan_probes.csv, plan_cheapest.csv and {path.name} to {out_dir}")
