"""`servelab sweep`: policies x rates x scheduler limits through the simulator, in parallel.

One row per point in a results table (Parquet and CSV under --out) and latency-vs-load
charts; `--capacity` also bisects each configuration's rate for the largest one that meets
the p99 TTFT and p99 ITL targets.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from servelab.cluster_args import add_cluster_args, cluster_from_args
from servelab.sim_args import (
    add_cost_model_args,
    add_output_args,
    add_prefix_caching_arg,
    deployment_options,
    parse_policies,
    write_json_atomic,
)
from servelab.slo_args import add_slo_p99_args, slo_from_args
from servelab.sweeps.grid import (
    DEFAULT_QPS_SCALES,
    Capacity,
    CapacitySlo,
    SweepContext,
    SweepPoint,
    capacity_records,
    find_capacity,
    grid,
)
from servelab.sweeps.rising import sweep_capacity, was_run
from servelab.sweeps.runners import LocalRunner, RayRunner
from servelab.trace_args import OPEN_LOOP_HELP, add_rate_args, add_trace_args, load_trace_from_args
from sim.deployment import Deployment, build_deployment
from sim.specs.engine_limits import ENGINE_DEFAULTS

QPS_SCALES_TEXT = ",".join(f"{x:g}" for x in DEFAULT_QPS_SCALES)


def register(subparsers: argparse._SubParsersAction) -> None:
    sweep = subparsers.add_parser(
        "sweep", help="simulate policies x rates x limits; capacity at SLO",
        description=__doc__.splitlines()[0])
    add_trace_args(sweep, positional=False)
    add_rate_args(sweep)
    sweep.add_argument("--open-loop", action="store_true", help=OPEN_LOOP_HELP)
    grid_args = sweep.add_argument_group("grid (comma-separated lists)")
    grid_args.add_argument("--policies", default="static,continuous,recompute,chunked",
                           help="batching policies (default: all four)")
    grid_args.add_argument("--qps-scales", default=QPS_SCALES_TEXT,
                           help="rates as multiples of the trace's own, on top of --qps-scale "
                                f"(default {QPS_SCALES_TEXT})")
    grid_args.add_argument("--num-blocks", default=None,
                           help="KV pool sizes in blocks (default: the deployment's)")
    grid_args.add_argument("--token-budgets", "--max-num-batched-tokens", dest="token_budgets",
                           default=None,
                           help="per-step token budgets of `chunked` (default: vLLM's for "
                                "the GPU when --model or --hardware names a deployment, else "
                                f"{ENGINE_DEFAULTS.token_budget})")
    grid_args.add_argument("--max-num-seqs", default=None,
                           help="most running requests (default: vLLM's for the GPU when "
                                "--model or --hardware names a deployment, else "
                                f"{ENGINE_DEFAULTS.max_num_seqs})")
    limits = sweep.add_argument_group("fixed limits")
    limits.add_argument("--block-size", type=int, default=ENGINE_DEFAULTS.block_size,
                        help="tokens per KV block (default %(default)s)")
    limits.add_argument("--max-model-len", type=int, default=None,
                        help="prompt+output limit per request (default: the deployment's)")
    add_prefix_caching_arg(limits)
    add_cost_model_args(sweep)
    add_cluster_args(sweep)
    add_output_args(sweep)
    run = sweep.add_argument_group("where")
    run.add_argument("--workers", type=int, default=None,
                     help="processes (default: one per core); with --ray, tasks in flight")
    run.add_argument("--ray", metavar="ADDRESS", default=None,
                     help="run on a Ray cluster: an address, or `auto` (a running cluster, "
                          "else a new local instance)")
    cap = sweep.add_argument_group("capacity at SLO")
    cap.add_argument("--capacity", action="store_true",
                     help="bisect each configuration's rate for the largest meeting the SLO")
    add_slo_p99_args(cap, CapacitySlo.ttft_p99_ms, CapacitySlo.itl_p99_ms,
                     "what --capacity searches the highest rate for")
    for metric in ("ttft", "itl"):  # the old spellings, hidden
        cap.add_argument(f"--capacity-{metric}-p99-ms", dest=f"slo_{metric}_p99_ms",
                         type=float, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    cap.add_argument("--capacity-full-runs", action="store_true",
                     help="run every rate of the grid and every capacity probe to its end "
                          "instead of skipping rates above one that misses the SLO and "
                          "stopping a probe once it certainly misses it (the same "
                          "capacities, slower)")
    cap.add_argument("--capacity-range", default="0.25,16",
                     help="LOW,HIGH qps scales to search between (default 0.25,16)")
    sweep.set_defaults(func=_run)


def _numbers(text: str | None, kind: type, flag: str) -> list:
    if text is None:
        return [None]
    if not text.strip():
        raise ValueError(f"{flag} is empty")
    if not all(v.strip() for v in text.split(",")):
        raise ValueError(f"{flag} {text!r} has an empty item")
    try:
        values = [kind(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(
            f"{flag}: expected comma-separated {kind.__name__}s, got {text!r}") from None
    if not values:
        raise ValueError(f"{flag} is empty")
    if any(v <= 0 for v in values):
        raise ValueError(f"{flag}: values must be > 0, got {text!r}")
    return values


def _run(args: argparse.Namespace) -> int:
    deployment = build_deployment(deployment_options(args))
    # Lists left unset take the deployment's limits (vLLM's for a GPU the user named).
    limits = deployment.engine_limits
    budgets = args.token_budgets
    if budgets is None and limits.vllm:
        budgets = str(limits.token_budget)
    seqs = str(limits.max_num_seqs) if args.max_num_seqs is None else args.max_num_seqs
    points = grid(parse_policies(args.policies),
                  _numbers(args.qps_scales, float, "--qps-scales"),
                  _numbers(args.num_blocks, int, "--num-blocks"),
                  _numbers(budgets, int, "--token-budgets"),
                  _numbers(seqs, int, "--max-num-seqs"))
    capacity_slo = CapacitySlo(args.slo_ttft_p99_ms, args.slo_itl_p99_ms)
    low, high = _capacity_range(args.capacity_range)
    where = deployment.description
    context = _context(args, deployment)
    for point in points:  # a bad combination fails now, before any run
        context.config(point)
    if args.ray is not None:
        runner = RayRunner(context, args.ray, args.workers, progress=True)
    else:
        runner = LocalRunner(context, args.workers, progress=True)
    capacities: list[Capacity] = []
    # A capacity search skips what load monotonicity decides (--capacity-full-runs: not).
    shortcuts = args.capacity and not args.capacity_full_runs
    with runner:
        if shortcuts:
            rows, capacities = sweep_capacity(runner, context, points, capacity_slo, low, high)
            grid_runs = sum(map(was_run, rows))
            runner.skip(len(rows) - grid_runs + sum(c.implied for c in capacities))
        else:
            rows = runner(points)
            grid_runs = len(rows)
            if args.capacity:
                capacities = _capacities(runner, points, rows, capacity_slo, low, high)
    table = _table(rows)
    trace = context.trace
    print(f"trace {trace.name}: {len(trace)} requests at {len(trace) / trace.span_s:.2f} req/s "
          f"(scale 1); {where}; {grid_runs} runs"
          + (f", {len(rows) - grid_runs} rates not run (they fail at a lower rate)"
             if grid_runs < len(rows) else ""))
    print(format_sweep(table))
    if capacities:
        print(format_capacity(capacities, capacity_slo))
        print(_capacity_runs(runner.counts, capacities, rows, grid_runs, shortcuts))
    if args.out is not None:
        _write_out(args.out, table, capacities, capacity_slo, trace.name)
    if args.json is not None:
        write_json_atomic(args.json, {"deployment": where, "rows": rows,
                                      "deployment_spec": deployment.to_dict(),
                                      "capacity": capacity_records(capacities, capacity_slo)})
    return 0


def _capacity_range(text: str) -> tuple[float, float]:
    """--capacity-range LOW,HIGH."""
    bounds = _numbers(text, float, "--capacity-range")
    if len(bounds) != 2 or bounds[0] >= bounds[1]:
        raise ValueError(f"--capacity-range: expected LOW,HIGH with 0 < low < high, "
                         f"got {text!r}")
    return bounds[0], bounds[1]


def _context(args: argparse.Namespace, deployment: Deployment) -> SweepContext:
    """What every point shares: the trace, the deployment's cost model, pool and limits."""
    # A calibrated server's prefix caching, unless the flag turned it off.
    caching = args.enable_prefix_caching and dict(deployment.server_limits).get(
        "enable_prefix_caching", True)
    return SweepContext(load_trace_from_args(args), deployment.cost_model,
                        deployment.kv_pool.num_blocks, deployment.kv_pool.block_size,
                        args.max_model_len or deployment.max_model_len, slo_from_args(args),
                        caching, cluster_from_args(args, deployment),
                        open_loop=args.open_loop)


def _capacity_runs(counts: dict, capacities: list[Capacity], rows: list[dict],
                   grid_runs: int, shortcuts: bool) -> str:
    """One line: the capacity search's own runs, and what it reused or decided unrun."""
    implied = sum(c.implied for c in capacities)
    reused = sum(p is r for c in capacities for p in c.probes for r in rows) - implied
    return (f"  {counts['started'] - grid_runs} capacity runs, {counts['stopped']} of them "
            f"stopped early (certain to miss the SLO); {reused} probes reused a sweep row"
            + (f", {implied} decided by one at another rate (not run)" if shortcuts else ""))


def _table(rows: list[dict]) -> pd.DataFrame:
    """The rows as one table, sorted by configuration then rate; integer counts stay
    integers (nullable where a row was not run)."""
    table = pd.DataFrame(rows)
    ran = [row for row in rows if was_run(row)]
    if ran and len(ran) < len(rows):
        ints = [k for k, v in ran[0].items() if type(v) is int]
        table[ints] = table[ints].astype("Int64")
    return table.sort_values(["policy", "num_blocks", "token_budget", "max_num_seqs",
                              "qps_scale"], kind="stable")


def _capacities(runner: LocalRunner | RayRunner, points: list[SweepPoint], rows: list[dict],
                slo: CapacitySlo, low: float, high: float) -> list[Capacity]:
    """Bisect each configuration's capacity, every probe run to its end, reusing the grid's
    rows at the rates it ran."""
    configs = list({p.config_key: p for p in points}.values())
    ran: dict[tuple, list[dict]] = {c.config_key: [] for c in configs}
    for point, row in zip(points, rows, strict=True):
        ran[point.config_key].append(row)
    return find_capacity(runner, configs, slo, low, high, stop_early=False,
                         known=[ran[c.config_key] for c in configs])


SWEEP_COLUMNS = (("rate_rps", "{:.2f}"), ("output_throughput", "{:.0f}"),
                 ("median_ttft_ms", "{:.0f}"), ("p99_ttft_ms", "{:.0f}"),
                 ("median_itl_ms", "{:.1f}"), ("p99_itl_ms", "{:.1f}"),
                 ("preemptions", "{:.0f}"))  # (a float once a row was not run)


def format_sweep(table: pd.DataFrame) -> str:
    head = f"{'policy':<11}{'blocks':>8}{'budget':>7}{'seqs':>5}{'qps x':>7}" + "".join(
        f"{key.removesuffix('_ms'):>18}" for key, _ in SWEEP_COLUMNS)
    lines = [head]
    for row in table.to_dict("records"):
        if not was_run(row):  # the rate, then why there are no numbers
            cells = f"{row['rate_rps']:>18.2f}   {row['not_run']}"
        else:
            cells = "".join(f"{'-' if pd.isna(row[k]) else fmt.format(row[k]):>18}"
                            for k, fmt in SWEEP_COLUMNS)
        lines.append(f"{row['policy']:<11}{row['num_blocks']:>8}{row['token_budget']:>7}"
                     f"{row['max_num_seqs']:>5}{row['qps_scale']:>7.3g}{cells}")
    return "\n".join(lines)


def format_capacity(capacities: list[Capacity], slo: CapacitySlo) -> str:
    lines = [f"capacity at p99 TTFT <= {slo.ttft_p99_ms:g} ms and p99 ITL <= "
             f"{slo.itl_p99_ms:g} ms:"]
    for record in capacity_records(capacities, slo):
        note = {"": "", "below-range": " (fails at the low end of the range)",
                "above-range": " (meets it at the high end: at least this)"}[record["bounded"]]
        lines.append(f"  {record['policy']:<11} blocks {record['num_blocks']:>6} budget "
                     f"{record['token_budget']:>5} seqs {record['max_num_seqs']:>4}: "
                     f"{record['capacity_qps_scale']:.3g}x = "
                     f"{record['capacity_rate_rps']:.2f} req/s{note}")
    return "\n".join(lines)


def _write_out(out_dir: Path, table: pd.DataFrame, capacities: list[Capacity],
               slo: CapacitySlo, title: str) -> None:
    from servelab.reporting.charts.sweep_charts import latency_vs_load
    from workloads.formats.files import atomic_output

    out_dir.mkdir(parents=True, exist_ok=True)
    for name, write in (("sweep.parquet", table.to_parquet), ("sweep.csv", table.to_csv)):
        with atomic_output(out_dir / name) as temp:
            write(temp, index=False)
    if capacities:
        pd.DataFrame(capacity_records(capacities, slo)).to_csv(out_dir / "capacity.csv",
                                                               index=False)
    ran = table[[was_run(row) for row in table.to_dict("records")]]  # (no numbers to draw)
    path = latency_vs_load(ran, capacity_records(capacities, slo), slo, out_dir, title)
    print(f"wrote sweep.parquet, sweep.csv{', capacity.csv' if capacities else ''} and "
          f"{path.name} to {out_dir}")
