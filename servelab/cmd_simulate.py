"""`servelab simulate` and `servelab compare`: replay a trace through the SimPy simulator."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from servelab.sim_args import (
    add_output_args,
    add_scheduler_args,
    format_summaries,
    parse_policies,
    scheduler_config,
    slo_from_args,
    write_json_atomic,
)
from servelab.trace_args import add_trace_args, load_trace_from_args
from sim.calibrated import CalibratedCostModel
from sim.core import Backend
from sim.cost_model import AnalyticCostModel
from sim.engine import Engine
from sim.metrics import Slo, inter_token_latencies_ms, request_table, step_table, summarize
from sim.scheduler import Scheduler, SchedulerConfig
from sim.simulation import run_trace
from sim.workload import requests_from_trace
from workloads.trace import Trace

DEFAULT_MAX_MODEL_LEN = 8192


@dataclass
class PolicyOutcome:
    """One policy's summary, plus its tables when --out asked for them."""

    summary: dict
    tables: object | None = None  # sim.charts.RunTables


def simulate_policy(trace: Trace, config: SchedulerConfig, backend: Backend,
                    slo: Slo | None, keep_tables: bool, progress: bool = False) -> PolicyOutcome:
    """Run one policy over the whole trace (a process-pool worker for compare)."""
    requests = requests_from_trace(trace)
    engine = Engine(Scheduler(config), backend)
    bar = tqdm(total=round(trace.span_s, 1), unit="sim-s", file=sys.stderr,
               desc=config.policy, disable=None if progress else True, leave=False)
    on_step = _progress_hook(bar) if progress else None
    result = run_trace(requests, engine, on_step=on_step)
    bar.close()
    summary = summarize(result, slo)
    if not keep_tables:
        return PolicyOutcome(summary)
    from sim.charts import RunTables

    tables = RunTables(summary=summary, requests=request_table(result.requests),
                       steps=step_table(result.steps),
                       itl_ms=inter_token_latencies_ms(result.requests),
                       num_blocks=config.num_blocks)
    return PolicyOutcome(summary, tables)


def _progress_hook(bar: tqdm):
    count = [0]

    def on_step(now_s: float, _finished: list) -> None:
        count[0] += 1
        if count[0] % 4096 == 0:
            bar.n = min(round(now_s, 1), bar.total)
            bar.refresh()

    return on_step


def register(subparsers: argparse._SubParsersAction) -> None:
    sim = subparsers.add_parser("simulate", help="simulate one policy on a trace")
    add_trace_args(sim, positional=False)
    sim.add_argument("--policy", default="continuous", help="static|continuous|recompute|chunked")
    _add_deployment_args(sim)
    sim.set_defaults(func=lambda args: _run(args, parse_policies(args.policy)))

    cmp = subparsers.add_parser("compare", help="simulate several policies on one trace")
    add_trace_args(cmp, positional=False)
    cmp.add_argument("--policies", default="static,continuous,recompute,chunked",
                     help="comma-separated policies")
    cmp.add_argument("--workers", type=int, default=None,
                     help="processes to run policies in (default: one per policy, <= cores)")
    _add_deployment_args(cmp)
    cmp.set_defaults(func=lambda args: _run(args, parse_policies(args.policies)))


def _add_deployment_args(parser: argparse.ArgumentParser) -> None:
    add_scheduler_args(parser)
    add_cost_model_args(parser)
    add_output_args(parser)


def add_cost_model_args(parser: argparse.ArgumentParser) -> None:
    """--model, --hardware, --dtype, --cost-model: what deployment_backend reads."""
    group = parser.add_argument_group("deployment (analytic cost model)")
    group.add_argument("--model", default="llama-3-8b", help="model shape preset")
    group.add_argument("--hardware", default="h100", help="GPU preset: a100-80gb, h100, h200")
    group.add_argument("--dtype", default="bf16", help="bf16 or fp16")
    group.add_argument("--cost-model", type=Path, default=None,
                       help="a calibration JSON from `servelab calibrate` instead of the "
                            "analytic model (its KV pool and max length become the defaults)")


def deployment_backend(args: argparse.Namespace) -> tuple[Backend, int, int, str]:
    """The cost model, its default KV blocks and max length, and a one-line description."""
    if args.cost_model is not None:
        model = CalibratedCostModel.load(args.cost_model)
        meta = model.meta
        if meta.get("block_size", args.block_size) != args.block_size:
            raise ValueError(f"{args.cost_model}: calibrated with block size "
                             f"{meta['block_size']}, --block-size is {args.block_size}")
        where = f"calibrated {meta.get('model', '?')} on {meta.get('hardware', '?')}"
        return model, meta.get("num_blocks", 4096), meta.get("max_model_len", 2048), where
    model = AnalyticCostModel.preset(args.model, args.hardware, args.dtype)
    max_len = min(model.model.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
    where = f"{args.model} on {args.hardware} ({args.dtype})"
    return model, model.kv_pool_blocks(args.block_size), max_len, where


def _run(args: argparse.Namespace, policies: list[str]) -> int:
    backend, num_blocks, max_model_len, where = deployment_backend(args)
    configs = {p: scheduler_config(args, p, num_blocks, max_model_len) for p in policies}
    if getattr(args, "workers", None) is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    trace = load_trace_from_args(args)
    slo = slo_from_args(args)
    outcomes = _run_all(trace, configs, backend, slo, args.out is not None,
                        getattr(args, "workers", None))
    results = {p: outcomes[p].summary for p in policies}
    print(f"trace {trace.name}: {len(trace)} requests over {trace.span_s:.1f} s; {where}, "
          f"{configs[policies[0]].num_blocks} KV blocks of {args.block_size}")
    print(format_summaries(results))
    payload = {
        "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
        "config": {
            "deployment": where,
            "scheduler": {p: {**asdict(c), "token_budget": c.budget} for p, c in configs.items()},
            "slo": None if slo is None else asdict(slo),
        },
        "results": results,
    }
    if args.out is not None:
        _write_out(args.out, trace.name, outcomes)
        write_json_atomic(args.out / "summary.json", payload)
    if args.json is not None:
        write_json_atomic(args.json, payload)
    return 0


def _run_all(trace: Trace, configs: dict[str, SchedulerConfig], backend: Backend,
             slo: Slo | None, keep_tables: bool, workers: int | None) -> dict[str, PolicyOutcome]:
    policies = list(configs)
    workers = workers or min(len(policies), os.cpu_count() or 1)
    if workers == 1 or len(policies) == 1:
        return {p: simulate_policy(trace, configs[p], backend, slo, keep_tables, progress=True)
                for p in policies}
    context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {p: pool.submit(simulate_policy, trace, configs[p], backend, slo, keep_tables)
                   for p in policies}
        done = {}
        with tqdm(total=len(policies), unit="policy", file=sys.stderr, leave=False,
                  disable=None) as bar:
            for policy in policies:
                done[policy] = futures[policy].result()
                bar.update(1)
    return done


def _write_out(out_dir: Path, trace_name: str, outcomes: dict[str, PolicyOutcome]) -> None:
    from sim.charts import write_charts

    out_dir.mkdir(parents=True, exist_ok=True)
    runs = {p: o.tables for p, o in outcomes.items()}
    for policy, tables in runs.items():
        tables.requests.to_csv(out_dir / f"requests_{policy}.csv", index=False)
        tables.steps.to_parquet(out_dir / f"steps_{policy}.parquet", index=False)
    paths = write_charts(runs, out_dir, title=trace_name)
    print(f"wrote {len(paths)} charts and {2 * len(runs)} tables to {out_dir}")
