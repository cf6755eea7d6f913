"""Data-parallel ranks that step together, as vLLM runs data parallelism with expert
parallelism: every MoE layer all-gathers the ranks' tokens, so a step starts on every rank
at once and lasts as long as the slowest rank's; a rank with nothing to do runs a dummy
batch of one token to take part. Requests go to the rank with the least
4 x waiting + running, as vLLM's data-parallel front end picks.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.cost.gpu_cost import GpuCostModel
from sim.engine.core import BatchPlan, Request, StepResult, request_overhead_s
from sim.engine.step import Engine
from sim.engine.step_log import StepLog
from sim.replay.simulation import RunResult, StalledError

DUMMY_BATCH = BatchPlan(decode_seqs=1, decode_context=1)  # an idle rank's forward


def group_step_s(model: GpuCostModel, plans: Sequence[BatchPlan | None]) -> float:
    """One lockstep step: each rank's own layers on its tokens, its experts on every rank's
    tokens; the slowest rank sets the step."""
    plans = [DUMMY_BATCH if p is None else p for p in plans]
    tokens = [p.prefill_tokens + p.decode_seqs for p in plans]
    total = sum(tokens)
    layers = model.shapes.num_layers
    return max(model.predict(p) + layers * (model.mlp_s(n, total) - model.mlp_s(n))
               for p, n in zip(plans, tokens, strict=True))


def run_lockstep(requests: Sequence[Request], engines: Sequence[Engine],
                 model: GpuCostModel) -> RunResult:
    """Replay requests (sorted by arrival_s) over data-parallel ranks stepping together."""
    pending, arrived, now = list(requests), 0, 0.0
    delay_s = request_overhead_s(model)  # the front end's time before the scheduler sees one
    while True:
        while arrived < len(pending) and pending[arrived].arrival_s + delay_s <= now:
            _least_loaded(engines).add(pending[arrived])
            arrived += 1
        plans = [engine.schedule(now) for engine in engines]
        if all(plan is None for plan in plans):
            if arrived == len(pending):
                if any(e.scheduler.has_unfinished for e in engines):
                    raise StalledError(f"t={now:.3f}s: queued requests, none admissible")
                break
            now = max(now, pending[arrived].arrival_s + delay_s)
            continue
        result = StepResult(duration_s=group_step_s(model, plans))
        for engine, plan in zip(engines, plans, strict=True):
            if plan is not None:
                engine.finish_step(plan, result, now)
        now += result.duration_s
    config = engines[0].scheduler.config
    return RunResult(list(requests), StepLog.concat(e.steps for e in engines),
                     sum(e.scheduler.num_preemptions for e in engines), config.num_blocks,
                     config.max_num_seqs)


def _least_loaded(engines: Sequence[Engine]) -> Engine:
    return min(engines, key=lambda e: 4 * len(e.scheduler.waiting) + len(e.scheduler.running))
