"""`servelab bench-serve --find-capacity`: the options, the search with its progress bar, the
stage table, the latency-vs-load chart and the JSON."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from servelab.sim_args import write_json_atomic

_STAGE_COLUMNS = ("stage", "rate_rps", "requests", "completed", "failed", "stopped",
                  "p99_ttft_ms",
                  "p99_itl_ms", "output_throughput", "verdict", "duration_s")


def add_capacity_args(parser: argparse.ArgumentParser) -> None:
    """The capacity search's options."""
    cap = parser.add_argument_group(
        "capacity at SLO (--find-capacity)",
        "Replay the trace at rising rates (each --capacity-growth times the last) until p99 "
        "TTFT or p99 ITL breaks its target, then bisect; a stage stops early once its "
        "verdict is certain, and the search stops within --capacity-budget-s.")
    cap.add_argument("--find-capacity", action="store_true",
                     help="search the highest rate that holds the SLO")
    cap.add_argument("--slo-ttft-p99-ms", type=float, default=2000.0,
                     help="p99 TTFT target (default 2000)")
    cap.add_argument("--slo-itl-p99-ms", type=float, default=200.0,
                     help="p99 ITL target (default 200)")
    cap.add_argument("--capacity-start-rate", type=float, default=None,
                     help="first stage's rate in req/s (default: the trace's own)")
    cap.add_argument("--capacity-growth", type=float, default=2.0,
                     help="rate factor between stages until one breaks (default 2)")
    cap.add_argument("--capacity-tolerance", type=float, default=0.05,
                     help="stop bisecting once the broken rate is within this share of the "
                          "held one (default 0.05)")
    cap.add_argument("--capacity-budget-s", type=float, default=900.0,
                     help="the whole search's time limit in seconds (default 900)")
    cap.add_argument("--out", type=Path, default=None,
                     help="directory for the stage table (CSV) and latency_vs_load.png")


def run_capacity(args: argparse.Namespace, trace, config) -> int:
    """Search, print each stage as it ends and the result; write --out and --json."""
    from servelab.bench.capacity import CapacitySearch, find_live_capacity
    from servelab.bench.capacity_stage import stage_runner, trace_rate_rps, warm_up
    from servelab.bench.client import model_card
    from servelab.bench.connection import make_client
    from servelab.sweeps.grid import CapacitySlo

    slo = CapacitySlo(args.slo_ttft_p99_ms, args.slo_itl_p99_ms)
    start = args.capacity_start_rate or trace_rate_rps(trace)
    search = CapacitySearch(start, args.capacity_growth, args.capacity_tolerance,
                            args.capacity_budget_s)

    async def card() -> dict:
        async with make_client(config) as client:
            return await model_card(client, config.model)

    model = asyncio.run(card())
    asyncio.run(warm_up(config))
    vocab = args.vocab_size or model.get("vocab_size")
    if not vocab:
        raise ValueError(f"{config.url} does not report its vocab size; pass --vocab-size")
    print(f"capacity of {args.url} ({model['id']}) on trace {trace.name} ({len(trace)} "
          f"requests a stage) at p99 TTFT <= {slo.ttft_p99_ms:g} ms and p99 ITL <= "
          f"{slo.itl_p99_ms:g} ms, within {search.budget_s:g} s")
    print(_stage_header())
    with tqdm(unit="req", file=sys.stderr, leave=False, disable=None) as bar:
        def on_start(rate: float, count: int) -> None:
            bar.reset(total=count)
            bar.set_description(f"stage at {rate:.3g} req/s")

        runner = stage_runner(trace, config, int(vocab), args.seed, slo, lambda: bar.update(1),
                              on_start)
        stages: list[dict] = []

        def on_stage(row: dict) -> None:
            row["stage"] = len(stages) + 1
            row["verdict"] = _verdict(row)
            stages.append(row)
            bar.clear()
            print(_stage_line(row), flush=True)

        result = asyncio.run(find_live_capacity(runner, search, on_stage=on_stage))
    print(f"capacity: {result.rate_rps:.3g} req/s ({_ENDED[result.ended]})")
    _write(args, trace, model["id"], slo, result, stages)
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


def _write(args: argparse.Namespace, trace, model: str, slo, result, stages: list[dict]
           ) -> None:
    """--out: stages.csv and the chart; --json: everything."""
    record = {"policy": model, "num_blocks": 0, "token_budget": 0, "max_num_seqs": 0,
              "capacity_rate_rps": result.rate_rps}
    if args.out is not None:
        from servelab.reporting.charts.sweep_charts import latency_vs_load

        args.out.mkdir(parents=True, exist_ok=True)
        table = pd.DataFrame(stages, columns=[*_STAGE_COLUMNS, "qps_scale", "stopped_early",
                                              "incomplete"])
        latencies = ["p99_ttft_ms", "p99_itl_ms"]
        table[latencies] = table[latencies].astype(float)  # a stage with no answer: NaN
        table.to_csv(args.out / "stages.csv", index=False)
        # The chart draws every configuration's line; here there is one, the server.
        chart = table.assign(policy=model, num_blocks=0, token_budget=0, max_num_seqs=0)
        # A stage stopped early measured a part of its run: its throughput is no point on
        # the curve (its latencies still show the break).
        chart["output_throughput"] = chart["output_throughput"].where(~chart["stopped_early"])
        path = latency_vs_load(chart[~chart["incomplete"]], [record], slo, args.out,
                               f"{trace.name} against {args.url}, measured by the client")
        print(f"wrote {args.out / 'stages.csv'} and {path}")
    if args.json is not None:
        write_json_atomic(args.json, {
            "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
            "config": {"url": args.url, "model": model, "seed": args.seed,
                       "max_concurrency": args.max_concurrency},
            "capacity": {"rate_rps": result.rate_rps, "ended": result.ended,
                         "slo_ttft_p99_ms": slo.ttft_p99_ms, "slo_itl_p99_ms": slo.itl_p99_ms,
                         "budget_s": args.capacity_budget_s},
            "stages": [{k: row[k] for k in (*_STAGE_COLUMNS, "qps_scale", "stopped_early",
                                             "incomplete")} for row in stages],
        })
