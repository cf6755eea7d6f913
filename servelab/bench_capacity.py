"""`servelab bench-serve --find-capacity`: the search with its progress bar, the stage table,
the latency-vs-load chart and the JSON (the flags are in servelab/capacity_args.py)."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from tqdm import tqdm

from servelab.sim_args import write_json_atomic
from servelab.sweeps.grid import CapacitySlo
from workloads.trace import Trace

if TYPE_CHECKING:  # the HTTP client loads only when a command talks to a server
    from servelab.bench.connection import BenchConfig

_STAGE_COLUMNS = ("stage", "rate_rps", "requests", "completed", "failed", "stopped",
                  "p99_ttft_ms",
                  "p99_itl_ms", "output_throughput", "verdict", "duration_s")


@dataclass(frozen=True)
class CapacityOptions:
    """One search: the SLO, its rates (None start: the trace's own), its time budget, and
    where the stage table, chart and JSON go."""

    slo: CapacitySlo
    start_rate_rps: float | None
    growth: float  # rate factor between stages until one breaks
    tolerance: float  # stop bisecting once the broken rate is within this share of the held
    budget_s: float  # the whole search's time limit
    vocab_size: int | None = None  # None: the server's
    seed: int = 0
    out: Path | None = None  # stages.csv and latency_vs_load.png
    json: Path | None = None


def run_capacity(options: CapacityOptions, trace: Trace, config: BenchConfig) -> int:
    """Search, print each stage as it ends and the result; write the table, chart and JSON."""
    from servelab.bench.capacity import CapacitySearch, find_live_capacity
    from servelab.bench.capacity_stage import stage_runner, trace_rate_rps, warm_up
    from servelab.bench.client import model_card
    from servelab.bench.connection import make_client

    slo = options.slo
    start = options.start_rate_rps or trace_rate_rps(trace)
    search = CapacitySearch(start, options.growth, options.tolerance, options.budget_s)

    async def card() -> dict:
        async with make_client(config) as client:
            return await model_card(client, config.model)

    model = asyncio.run(card())
    asyncio.run(warm_up(config))
    vocab = options.vocab_size or model.get("vocab_size")
    if not vocab:
        raise ValueError(f"{config.url} does not report its vocab size; pass --vocab-size")
    print(f"capacity of {config.url} ({model['id']}) on trace {trace.name} ({len(trace)} "
          f"requests a stage) at p99 TTFT <= {slo.ttft_p99_ms:g} ms and p99 ITL <= "
          f"{slo.itl_p99_ms:g} ms, within {search.budget_s:g} s")
    print(_stage_header())
    with tqdm(unit="req", file=sys.stderr, leave=False, disable=None) as bar:
        def on_start(rate: float, count: int) -> None:
            bar.reset(total=count)
            bar.set_description(f"stage at {rate:.3g} req/s")

        runner = stage_runner(trace, config, int(vocab), options.seed, slo,
                              lambda: bar.update(1), on_start)
        stages: list[dict] = []

        def on_stage(row: dict) -> None:
            row["stage"] = len(stages) + 1
            row["verdict"] = _verdict(row)
            stages.append(row)
            bar.clear()
            print(_stage_line(row), flush=True)

        result = asyncio.run(find_live_capacity(runner, search, on_stage=on_stage))
    print(f"capacity: {result.rate_rps:.3g} req/s ({_ENDED[result.ended]})")
    _write(options, config, trace, model["id"], result, stages)
    return 0


_ENDED = {"bracketed": "bracketed within the tolerance", "budget": "stopped by the time budget",
          "max-stages": "stopped after the most stages", "none-held": "no rate tried held"}


def _verdict(row: dict) -> str:
    if row["incomplete"]:
        return "cut (budget)"
    if row["passed"]:
        return "pass"
    return "fail (early)" if row["stopped_early"] else "fail"


def _stage_header() -> str:
    return (f"{'stage':>5} {'rate/s':>8} {'reqs':>5} {'done':>5} {'failed':>6} {'cut':>5} "
            f"{'p99 TTFT ms':>12} {'p99 ITL ms':>11} {'tok/s':>8}  verdict")


def _stage_line(row: dict) -> str:
    def ms(value: float | None) -> str:
        return f"{value:12.1f}" if value is not None else f"{'-':>12}"

    return (f"{row['stage']:>5} {row['rate_rps']:8.3g} {row['requests']:>5} "
            f"{row['completed']:>5} {row['failed']:>6} {row['stopped']:>5} "
            f"{ms(row['p99_ttft_ms'])}"
            f"{ms(row['p99_itl_ms'])[1:]} {row['output_throughput']:8.1f}  {row['verdict']}")


def _write(options: CapacityOptions, config: BenchConfig, trace: Trace, model: str, result,
           stages: list[dict]) -> None:
    """out: stages.csv and the chart; json: everything."""
    slo, out = options.slo, options.out
    record = {"policy": model, "num_blocks": 0, "token_budget": 0, "max_num_seqs": 0,
              "capacity_rate_rps": result.rate_rps}
    if out is not None:
        from servelab.reporting.charts.sweep_charts import latency_vs_load

        out.mkdir(parents=True, exist_ok=True)
        table = pd.DataFrame(stages, columns=[*_STAGE_COLUMNS, "qps_scale", "stopped_early",
                                              "incomplete"])
        latencies = ["p99_ttft_ms", "p99_itl_ms"]
        table[latencies] = table[latencies].astype(float)  # a stage with no answer: NaN
        table.to_csv(out / "stages.csv", index=False)
        # The chart draws every configuration's line; here there is one, the server.
        chart = table.assign(policy=model, num_blocks=0, token_budget=0, max_num_seqs=0)
        # A stage stopped early measured a part of its run: its throughput is no point on
        # the curve (its latencies still show the break).
        chart["output_throughput"] = chart["output_throughput"].where(~chart["stopped_early"])
        path = latency_vs_load(chart[~chart["incomplete"]], [record], slo, out,
                               f"{trace.name} against {config.url}, measured by the client")
        print(f"wrote {out / 'stages.csv'} and {path}")
    if options.json is not None:
        write_json_atomic(options.json, {
            "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
            "config": {"url": config.url, "model": model, "seed": options.seed,
                       "max_concurrency": config.max_concurrency},
            "capacity": {"rate_rps": result.rate_rps, "ended": result.ended,
                         "slo_ttft_p99_ms": slo.ttft_p99_ms, "slo_itl_p99_ms": slo.itl_p99_ms,
                         "budget_s": options.budget_s},
            "stages": [{k: row[k] for k in (*_STAGE_COLUMNS, "qps_scale", "stopped_early",
                                             "incomplete")} for row in stages],
        })
