"""Data-parallel ranks that step together, as vLLM runs data parallelism with expert
parallelism: every MoE layer all-gathers the ranks' tokens, so a step starts on every rank
at once and lasts as long as the slowest rank's; a rank with nothing to do runs a dummy
batch of one token to take part. Requests go to the rank with the least
4 x waiting + running, as vLLM's data-parallel front end picks. Arrivals come from the
requests' times, or from a closed loop (sim.cluster.closed_loop.ClosedLoop) that releases a
request when the answer it waits for has finished.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from sim.cluster.closed_loop import ClosedLoop
from sim.cost.gpu_cost import GpuCostModel
from sim.engine.core import BatchPlan, Request, StepResult, request_overhead_s
from sim.engine.step import Engine
from sim.engine.step_log import StepLog
from sim.replay.simulation import RunResult, StalledError

DUMMY_BATCH = BatchPlan(decode_seqs=1, decode_context=1)  # an idle rank's forward


def group_step_s(model: GpuCostModel, plans: Sequence[BatchPlan | None]) -> float:
    """One lockstep step: each rank's own layers on its tokens, its experts on every rank's
    tokens; the slowest rank sets the step. When no rank has more tokens than the largest
    CUDA graph captured, vLLM pads every rank to the most tokens any has (so all replay a
    graph), and the experts see that many from each rank; a larger step runs eagerly,
    unpadded."""
    plans = [DUMMY_BATCH if p is None else p for p in plans]
    tokens = [p.prefill_tokens + p.decode_seqs for p in plans]
    most = max(tokens)
    total = most * len(tokens) if most <= model.engine.graph_max_rows else sum(tokens)
    layers = model.shapes.num_layers
    return max(model.predict(p) + layers * (model.mlp_s(n, total) - model.mlp_s(n))
               for p, n in zip(plans, tokens, strict=True))


class _Arrivals:
    """Requests in release order: the trace's times, or the loop's releases as answers end."""

    def __init__(self, requests: Sequence[Request], loop: ClosedLoop | None,
                 delay_s: float = 0.0) -> None:
        self.loop = loop
        self.delay_s = delay_s  # from release to the scheduler (the front end's time)
        self.heap: list[tuple[float, int, Request]] = []  # (arrival_s, order, request)
        self.order = 0
        started = (loop.start() if loop is not None
                   else [(request.arrival_s, request) for request in requests])
        for at_s, request in started:
            self.release(at_s, request)

    def release(self, at_s: float, request: Request) -> None:
        if self.loop is not None:
            self.loop.released(request, at_s)
        heapq.heappush(self.heap, (at_s + self.delay_s, self.order, request))
        self.order += 1

    def answered(self, request: Request, at_s: float) -> None:
        """`request` ended at `at_s`: release what waited for it (closed loop only)."""
        released = self.loop.finished(request, at_s) if self.loop is not None else None
        if released is not None:
            self.release(*released)

    def next_s(self) -> float | None:
        return self.heap[0][0] if self.heap else None

    def due(self, now: float) -> list[tuple[float, Request]]:
        """The requests released by `now` and when each reached the scheduler, in release
        order."""
        out = []
        while self.heap and self.heap[0][0] <= now:
            at_s, _, request = heapq.heappop(self.heap)
            out.append((at_s, request))
        return out


def run_lockstep(requests: Sequence[Request], engines: Sequence[Engine],
                 model: GpuCostModel, loop: ClosedLoop | None = None) -> RunResult:
    """Replay requests over data-parallel ranks stepping together: at their arrival_s, or
    as `loop` releases them."""
    # The front end's time before the scheduler sees a request.
    arrivals, now = _Arrivals(requests, loop, request_overhead_s(model)), 0.0
    try:
        while True:
            # Requests that came during the step just ended queue now (an engine that
            # schedules ahead holds them one step, sim.engine.step.Engine.held); those that
            # came as it ended (a closed loop's next turns) came while the next was planned.
            due = arrivals.due(now)
            _queue(engines, arrivals, [(at_s, r) for at_s, r in due if at_s < now], now)
            edge = [(at_s, r) for at_s, r in due if at_s >= now]
            plans = [engine.schedule(now) for engine in engines]
            if all(plan is None for plan in plans):
                if edge:  # idle ranks plan as soon as a request comes
                    _queue(engines, arrivals, edge, now)
                    continue
                next_s = arrivals.next_s()
                if next_s is None:
                    if any(e.scheduler.has_unfinished for e in engines):
                        raise StalledError(f"t={now:.3f}s: queued requests, none admissible")
                    break
                now = max(now, next_s)
                continue
            result = StepResult(duration_s=group_step_s(model, plans))
            for engine in engines:
                engine.busy_until = now + result.duration_s
            _queue(engines, arrivals, edge, now)
            for engine, plan in zip(engines, plans, strict=True):
                if plan is not None:
                    for request in engine.finish_step(plan, result, now):
                        end_s = request.finish_s
                        arrivals.answered(request, now + result.duration_s if end_s is None
                                          else end_s)
            now += result.duration_s
    finally:
        if loop is not None:
            loop.restore_unreleased()
    config = engines[0].scheduler.config
    return RunResult(list(requests), StepLog.concat(e.steps for e in engines),
                     sum(e.scheduler.num_preemptions for e in engines), config.num_blocks,
                     config.max_num_seqs)


def _queue(engines: Sequence[Engine], arrivals: _Arrivals,
           items: list[tuple[float, Request]], now: float) -> None:
    """Queue each request, come at its time, on the least loaded rank; a rejected one
    releases what waited for it."""
    for at_s, request in items:
        if not _least_loaded(engines).add(request, at_s):
            arrivals.answered(request, now)


def _least_loaded(engines: Sequence[Engine]) -> Engine:
    return min(engines, key=lambda e: 4 * (len(e.scheduler.waiting) + len(e.held))
               + len(e.scheduler.running))
