"""A trace through one or several policies in the simulator: summaries, and the per-request
and per-step tables that charts read."""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm import tqdm

from sim.cluster.closed_loop import ClosedLoop, closed_loop, run_closed_cluster, run_closed_trace
from sim.cluster.config import ClusterConfig
from sim.cluster.run import ClusterResult, run_cluster
from sim.cluster.tables import replica_table, served_by
from sim.engine.core import Backend, Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.engine.step_log import StepLog
from sim.replay.metrics import (
    Slo,
    inter_token_latencies_ms,
    request_table,
    step_table,
    summarize,
)
from sim.replay.overload import EngineLimits, Overload, overload_verdict
from sim.replay.simulation import RunResult, run_trace
from sim.replay.verdict import VerdictReached
from sim.replay.workload import requests_from_trace
from workloads.trace import Trace


@dataclass(frozen=True)
class RunTables:
    """One policy's results, as the charts read them."""

    summary: dict  # sim.replay.metrics.summarize() output
    requests: pd.DataFrame  # sim.replay.metrics.request_table()
    steps: pd.DataFrame  # sim.replay.metrics.step_table(): the fields of StepRecord
    itl_ms: np.ndarray  # sim.replay.metrics.inter_token_latencies_ms(), shape [num_gaps]
    num_blocks: int  # KV pool size, turns kv_blocks_used into a fraction


@dataclass
class PolicyOutcome:
    """One policy's summary, plus its tables when --out asked for them, plus one row per
    engine when it ran as a cluster."""

    summary: dict
    tables: RunTables | None = None
    replicas: pd.DataFrame | None = None  # sim.cluster.tables.replica_table()
    verdict: Overload | None = None  # sim.replay.overload; None for a cluster


def simulate_policy(trace: Trace, config: SchedulerConfig, backend: Backend,
                    slo: Slo | None, keep_tables: bool, progress: bool = False,
                    cluster: ClusterConfig | None = None,
                    users: int | None = None, open_loop: bool = False) -> PolicyOutcome:
    """Run one policy over the whole trace (a process-pool worker for compare), on one
    engine or on the cluster described by `cluster`: sessions closed-loop (by `users`
    users if given) unless open_loop replays every arrival time as written."""
    requests = requests_from_trace(trace)
    loop = closed_loop(trace, requests, users, open_loop)
    bar = tqdm(total=round(trace.span_s, 1), unit="sim-s", file=sys.stderr,
               desc=config.policy, disable=None if progress else True, leave=False)
    on_step = _progress_hook(bar) if progress else None
    result, ran = run_deployment(requests, config, backend, cluster, on_step, loop)
    replicas = None if ran is None else replica_table(ran)
    bar.close()
    summary = summarize(result, slo)
    if ran is not None:  # a cluster: one queue per engine, no single verdict
        tables = run_tables(result, summary) if keep_tables else None
        if tables is not None:
            tables.requests["replica"] = served_by(ran)
        return PolicyOutcome(summary, tables, replicas)
    steps, table = step_table(result.steps), request_table(result.requests)
    limits = EngineLimits(config.num_blocks, config.budget, config.max_num_seqs)
    verdict = overload_verdict(steps, table, limits)
    if not keep_tables:
        return PolicyOutcome(summary, replicas=replicas, verdict=verdict)
    tables = RunTables(summary, table, steps, inter_token_latencies_ms(result.requests),
                       result.num_blocks)
    return PolicyOutcome(summary, tables, replicas, verdict)


def run_tables(result: RunResult, summary: dict) -> RunTables:
    """A finished run (simulated or measured) as the tables `--out` writes and charts read."""
    return RunTables(summary=summary, requests=request_table(result.requests),
                     steps=step_table(result.steps),
                     itl_ms=inter_token_latencies_ms(result.requests),
                     num_blocks=result.num_blocks)


def run_deployment(requests: list[Request], config: SchedulerConfig, backend: Backend,
                   cluster: ClusterConfig | None = None,
                   on_step: Callable[[float, list[Request]], None] | None = None,
                   loop: ClosedLoop | None = None,
                   ) -> tuple[RunResult, ClusterResult | None]:
    """Requests through one engine, or through the cluster `cluster` describes (every
    engine with its own scheduler of `config`); the cluster's own result when there is one.
    An on_step that raises VerdictReached (sim.replay.verdict.SloWatch) stops the replay: the run
    as it stood, with its stop time (and no cluster result): the requests that had arrived
    by then (those still to come were no part of it, and summing them up would cost as much
    as the stopped run itself). With a loop, requests arrive as it releases them
    (sim.cluster.closed_loop), not at their times."""
    single = cluster is None or cluster.num_engines == 1 and not cluster.disaggregated
    engines = [Engine(Scheduler(config), backend)
               for _ in range(1 if single else cluster.num_engines)]
    try:
        if single and loop is not None:
            return run_closed_trace(requests, engines[0], loop, on_step), None
        if single:
            return run_trace(requests, engines[0], on_step=on_step), None
        if loop is not None:
            ran = run_closed_cluster(requests, engines, cluster, loop, on_step)
        else:
            ran = run_cluster(requests, engines, cluster, on_step=on_step)
    except VerdictReached as stop:
        # A stop signal, not an error: its tracebacks (the frames it passed through, SimPy's
        # among them, which hold it in turn) would keep the replay's engines in cycles.
        cause: BaseException | None = stop
        while cause is not None:
            cause.__traceback__ = None
            cause = cause.__cause__
        return RunResult(
            requests=[r for r in requests if r.arrival_s <= stop.stopped_s],
            steps=StepLog.concat(e.steps for e in engines),
            num_preemptions=sum(e.scheduler.num_preemptions for e in engines),
            num_blocks=config.num_blocks, max_num_seqs=config.max_num_seqs,
            stopped_s=stop.stopped_s), None
    return ran.run_result(), ran


def _progress_hook(bar: tqdm):
    count = [0]

    def on_step(now_s: float, _finished: list) -> None:
        count[0] += 1
        if count[0] % 4096 == 0:
            bar.n = min(round(now_s, 1), bar.total)
            bar.refresh()

    return on_step


def simulate_policies(trace: Trace, configs: dict[str, SchedulerConfig], backend: Backend,
                      slo: Slo | None, keep_tables: bool, workers: int | None = None,
                      cluster: ClusterConfig | None = None, users: int | None = None,
                      open_loop: bool = False) -> dict[str, PolicyOutcome]:
    """Each policy over the whole trace, one process each (up to `workers`, default one per
    core), a progress bar per policy when run in this process (users, open_loop: as in
    simulate_policy)."""
    policies = list(configs)
    workers = workers or min(len(policies), os.cpu_count() or 1)
    if workers == 1 or len(policies) == 1:
        return {p: simulate_policy(trace, configs[p], backend, slo, keep_tables, True, cluster,
                                   users, open_loop)
                for p in policies}
    context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {p: pool.submit(simulate_policy, trace, configs[p], backend, slo, keep_tables,
                                  False, cluster, users, open_loop)
                   for p in policies}
        done = {}
        with tqdm(total=len(policies), unit="policy", file=sys.stderr, leave=False,
                  disable=None) as bar:
            for policy in policies:
                done[policy] = futures[policy].result()
                bar.update(1)
    return done


