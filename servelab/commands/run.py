"""`servelab run`: replay a trace through the scheduler with the real model executing steps.

The clock advances by each step's measured duration, so the run is the simulator's loop
with a measured backend: scheduling decisions match a simulation given the same durations.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from tqdm import tqdm

from servelab.model_args import add_model_args, load_model_from_args
from servelab.sim_args import (
    add_output_args,
    add_scheduler_args,
    format_summaries,
    parse_policies,
    scheduler_config,
    write_json_atomic,
)
from servelab.slo_args import slo_from_args
from servelab.trace_args import OPEN_LOOP_HELP, add_rate_args, add_trace_args, load_trace_from_args
from sim.cluster.closed_loop import closed_loop
from sim.engine.core import SamplingParams
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import DEFAULT_POLICY, POLICIES
from sim.engine.speculation.report import format_speculation, speculation_summary
from sim.policy_runs import RunTables, run_tables
from sim.replay.metrics import summarize
from sim.replay.simulation import RunResult
from sim.replay.workload import requests_from_trace


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser("run", help="replay a trace on the real model (measured)")
    add_trace_args(run, positional=False)
    add_rate_args(run)
    run.add_argument("--open-loop", action="store_true", help=OPEN_LOOP_HELP)
    run.add_argument("--policy", default=DEFAULT_POLICY, help="|".join(POLICIES))
    add_scheduler_args(run)
    add_model_args(run)
    sampling = run.add_argument_group("sampling (per request; seeded from --seed and its id)")
    sampling.add_argument("--temperature", type=float, default=0.0, help="0 means greedy")
    sampling.add_argument("--top-p", type=float, default=1.0,
                          help="nucleus sampling: the smallest set of tokens holding this "
                               "share of probability (default 1: all)")
    sampling.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    add_output_args(run)
    run.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    (policy,) = parse_policies(args.policy)
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              seed=args.seed)
    trace = load_trace_from_args(args)
    slo = slo_from_args(args)
    loaded = load_model_from_args(args)
    num_blocks = loaded.kv_blocks(args.block_size, args.kv_cache_gib)
    config = scheduler_config(args, policy, num_blocks, loaded.max_model_len(args.max_model_len),
                              lambda gib: loaded.kv_blocks(args.block_size, gib))
    start = time.perf_counter()
    schedulers: list[Scheduler] = []
    result = _measured(args, trace, sampling, config, loaded, schedulers)
    summary = summarize(result, slo)
    wall_s = time.perf_counter() - start
    if config.speculative is not None:  # the same run without speculation, to compare
        plain = summarize(_measured(args, trace, sampling, replace(config, speculative=None),
                                    loaded, []), slo)
        summary.update(speculation_summary(schedulers[0].speculator, summary, plain))
    print(f"trace {trace.name}: {len(trace)} requests over {trace.span_s:.1f} s; model "
          f"{loaded.name} on {loaded.device} ({str(loaded.dtype).removeprefix('torch.')}, "
          f"{loaded.threads} threads, {loaded.kernels} kernels), {config.num_blocks} KV blocks "
          f"of {config.block_size}; {wall_s:.1f} s wall")
    print(format_summaries({policy: summary}))
    if config.speculative is not None:
        print(format_speculation(summary))
    payload = _payload(args, trace, config, loaded, slo, policy, summary)
    if args.out is not None:  # the files `servelab simulate --out` writes, measured
        _write_out(args.out, trace.name, policy, run_tables(result, summary))
        write_json_atomic(args.out / "summary.json", payload)
    if args.json is not None:
        write_json_atomic(args.json, payload)
    return 0


def _measured(args, trace, sampling, config, loaded, schedulers: list[Scheduler]) -> RunResult:
    """One measured run of the trace under config; its scheduler is appended to schedulers."""
    from executor.replay import measured_run

    requests = requests_from_trace(trace, sampling, seed_requests=True)
    bar = tqdm(total=len(requests), unit="req", file=sys.stderr, leave=False, disable=None)
    loop = closed_loop(trace, requests, open_loop=args.open_loop)  # as simulate sends it
    result = measured_run(requests, config, loaded.model, args.seed,
                          on_step=lambda _now, done: bar.update(len(done)), loop=loop,
                          on_scheduler=lambda s: schedulers.append(_recording(s)))
    bar.close()
    return result


def _recording(scheduler: Scheduler) -> Scheduler:
    """The scheduler, its speculation (if on) keeping each request's counters for --json."""
    if scheduler.speculator is not None:
        scheduler.speculator.record_requests = True
    return scheduler


def _write_out(out_dir: Path, trace_name: str, policy: str, tables: RunTables) -> None:
    """requests_{policy}.csv, steps_{policy}.parquet and the four charts, as simulate names them."""
    from servelab.reporting.charts.basic import write_run_outputs

    charts, count = write_run_outputs({policy: tables}, out_dir, trace_name)
    print(f"wrote {charts} charts and {count} tables to {out_dir}")


def _payload(args, trace, config, loaded, slo, policy, summary) -> dict:
    import torch

    return {
        "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
        "config": {
            "model": loaded.name, "device": str(loaded.device),
            "dtype": str(loaded.dtype).removeprefix("torch."), "threads": loaded.threads,
            "kernels": loaded.kernels, "torch": torch.__version__,
            "processor": platform.processor() or platform.machine(),
            "scheduler": {policy: config.as_record()},
            "sampling": {"temperature": args.temperature, "top_p": args.top_p,
                         "top_k": args.top_k, "seed": args.seed},
            "slo": None if slo is None else asdict(slo),
        },
        "results": {policy: summary},
    }
