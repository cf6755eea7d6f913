"""A trace through one or several policies in the simulator: summaries, and the per-request
and per-step tables that charts read."""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm import tqdm

from sim.core import Backend
from sim.engine import Engine
from sim.metrics import Slo, inter_token_latencies_ms, request_table, step_table, summarize
from sim.scheduler import Scheduler, SchedulerConfig
from sim.simulation import run_trace
from sim.workload import requests_from_trace
from workloads.trace import Trace


@dataclass(frozen=True)
class RunTables:
    """One policy's results, as the charts read them."""

    summary: dict  # sim.metrics.summarize() output
    requests: pd.DataFrame  # sim.metrics.request_table()
    steps: pd.DataFrame  # sim.metrics.step_table(): the fields of StepRecord
    itl_ms: np.ndarray  # sim.metrics.inter_token_latencies_ms(), shape [num_gaps]
    num_blocks: int  # KV pool size, turns kv_blocks_used into a fraction


@dataclass
class PolicyOutcome:
    """One policy's summary, plus its tables when --out asked for them."""

    summary: dict
    tables: RunTables | None = None


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


def simulate_policies(trace: Trace, configs: dict[str, SchedulerConfig], backend: Backend,
                      slo: Slo | None, keep_tables: bool, workers: int | None = None
                      ) -> dict[str, PolicyOutcome]:
    """Each policy over the whole trace, one process each (up to `workers`, default one per
    core), a progress bar per policy when run in this process."""
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


