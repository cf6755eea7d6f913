"""The engine step, shared by every time driver: schedule -> execute -> wait -> update.

`Engine.step` is the step of the simulator, the cluster, the measured run and the HTTP
server's engine thread; they differ only in the `wait` they pass, that is, in how they let
a step's time pass. `Engine.quiet_steps` applies steps of a run priced at once (sim.replay.coast).
They are the only places a step is recorded (sim.engine.step_log).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from sim.engine.core import Backend, BatchPlan, PricesDecodeRuns, Request, StepResult, reads_rows
from sim.engine.scheduler import Scheduler
from sim.engine.step_log import StepLog, StepRecord, pack

# StepRecord lives in sim.engine.step_log; it is re-exported here for the drivers.
__all__ = ["Engine", "StepRecord", "Wait", "run_now"]


# How a driver lets a step's time pass, given the step's start and duration: the event its
# event loop waits on before the step is applied (a SimPy timeout), or None to apply it at
# once (a wall clock, whose backend already took the time; a simulator with no arrival
# inside the step).
Wait = Callable[[float, float], Any]

# Quiet steps applied together (Engine.quiet_steps) at the least: fewer are applied one at a
# time, which costs less than gathering their blocks and records when there are few.
TOGETHER_MIN = 5

@dataclass
class Engine:
    """A scheduler and a backend; records one row per executed step."""

    scheduler: Scheduler
    backend: Backend
    steps: StepLog = field(default_factory=StepLog)
    # The backend's PricesDecodeRuns.decode_steps_s, None without it (quiet runs price
    # their steps with it: resolved once, not per run).
    decode_run_price: Callable[[int, int, int], list[float]] | None = field(init=False)

    def __post_init__(self) -> None:
        backend = self.backend
        self.decode_run_price = (backend.decode_steps_s
                                 if isinstance(backend, PricesDecodeRuns) else None)

    def add(self, request: Request) -> bool:
        """Queue a request; False if it was rejected (it can never fit)."""
        return self.scheduler.add(request)

    def schedule(self, now: float) -> BatchPlan | None:
        """The next step's plan, scheduled at `now`; None when there is nothing to run."""
        plan = self.scheduler.schedule(now)
        # plan.is_empty, inlined (once per step); a step that only swaps KV out still runs.
        if (not plan.requests and not plan.deferred_decodes and not plan.padding
                and not plan.swap_out):
            return None
        return plan

    def defer_decodes(self) -> bool:
        """Let the scheduler keep decode rows out of the plans (sim.engine.deferred) when the
        backend prices a plan from its totals alone; returns whether it does."""
        if reads_rows(self.backend):
            return False
        return self.scheduler.defer_decodes()

    def execute(self, plan: BatchPlan) -> StepResult:
        """Run (or price) the plan on the backend."""
        return self.backend.execute(plan)

    def step(self, now: float, wait: Wait) -> Generator[Any, Any, list[Request] | None]:
        """Plan, execute and apply the step that starts at `now`; `wait` lets its time pass.
        A generator: a driver runs it with `yield from` (or run_now, on a wall clock).
        Returns the requests it finished, None when there was nothing to run."""
        plan = self.schedule(now)
        if plan is None:
            return None
        result = self.backend.execute(plan)
        event = wait(now, result.duration_s)
        if event is not None:
            yield event
        return self.finish_step(plan, result, now)

    def finish_step(self, plan: BatchPlan, result: StepResult, start_s: float) -> list[Request]:
        """Apply a step that ended at start_s + duration: tokens, retirements, a record."""
        duration_s = result.duration_s
        scheduler = self.scheduler
        finished = scheduler.update(plan, result, start_s + duration_s)
        for request in finished:
            self.backend.free(request)
        # The record (the plan's properties inlined: once per step).
        padding_rows, prefill_tokens, decode_seqs = (
            len(plan.padding), plan.prefill_tokens, plan.decode_seqs)
        batch_size = len(plan.requests) + plan.deferred_decodes + padding_rows
        num_tokens = prefill_tokens + decode_seqs
        kv_blocks_used = scheduler.block_manager.num_used_blocks
        num_waiting, num_running = len(scheduler.waiting), len(scheduler.running)
        num_preempted = len(plan.preempted)
        self.steps.add_packed(pack(
            start_s, duration_s, batch_size, num_tokens, prefill_tokens, decode_seqs,
            padding_rows, kv_blocks_used, num_waiting, num_running, num_preempted))
        return finished

    def quiet_steps(self, start_s: float, durations: list[float], first: int, last: int,
                    begun: int, on_step: Callable[[float, list[Request]], None] | None
                    ) -> None:
        """Apply quiet steps first..last-1 of a run priced at once (sim.replay.coast: each only
        decodes the deferred rows; step j lasts durations[j] and starts at start_s, the end
        of step first - 1): at the start of each not yet begun (j >= begun) the rows' new KV
        blocks, at its end its token times, the rows it finished (the run's last step only)
        and its record."""
        scheduler = self.scheduler
        deferred, bm = scheduler.deferred, scheduler.block_manager
        # Up to a step that changes rows at its end (a run's last) at once.
        count = min(last - first, deferred.steps_before_event() + 1)
        while count >= TOGETHER_MIN:
            start_s = self._quiet_steps_together(start_s, durations, first, first + count,
                                                 begun, on_step)
            first += count
            count = min(last - first, deferred.steps_before_event() + 1)
        allocate, try_allocate = deferred.allocate, bm.try_allocate
        update, cache_blocks, record = deferred.update, bm.cache_blocks, self.steps.add_packed
        batch_size = decode_seqs = num_tokens = len(deferred.rows)
        prefill_tokens = padding_rows = num_preempted = 0
        for j in range(first, last):
            if j >= begun:
                allocate(try_allocate, _no_room, None)
            duration_s = durations[j]
            end_s = start_s + duration_s
            finished = update(end_s, cache_blocks)
            if finished:
                scheduler.finish_deferred(finished, end_s)
                for request in finished:
                    self.backend.free(request)
            kv_blocks_used = bm.num_used_blocks
            num_waiting, num_running = len(scheduler.waiting), len(scheduler.running)
            record(pack(
                start_s, duration_s, batch_size, num_tokens, prefill_tokens, decode_seqs,
                padding_rows, kv_blocks_used, num_waiting, num_running, num_preempted))
            start_s = end_s
            if on_step is not None:
                on_step(end_s, finished)

    def _quiet_steps_together(self, start_s: float, durations: list[float], first: int,
                              last: int, begun: int,
                              on_step: Callable[[float, list[Request]], None] | None) -> float:
        """quiet_steps for steps first..last-1, of which only the last may change rows at its
        end: their blocks in one pass (in the order a step at a time takes them), then each
        one's record and on_step in turn, the last one's row events before its own; returns
        when the last ends."""
        scheduler = self.scheduler
        deferred, bm = scheduler.deferred, scheduler.block_manager
        used_before = bm.num_used_blocks
        taken = deferred.allocate_steps(max(begun - first, 0), last - first, bm.take_blocks)
        if taken is None:
            raise RuntimeError("a quiet step found no KV block")
        batch_size = decode_seqs = num_tokens = len(deferred.rows)
        prefill_tokens = padding_rows = num_preempted = 0
        num_waiting, num_running = len(scheduler.waiting), len(scheduler.running)
        ends = list(accumulate(durations[first:last], initial=start_s))  # (the same sums)
        starts = ends[:-1]
        del ends[0]
        deferred.advance(ends[:-1])
        record, final = self.steps.add_packed, last - first - 1
        used = [used_before + n for n in taken]
        finished: list[Request] = []
        for j, (start_s, duration_s, end_s, kv_blocks_used) in enumerate(
                zip(starts, durations[first:last], ends, used, strict=True)):
            if j == final:  # the last step: its row events first
                finished = deferred.update(end_s, bm.cache_blocks)
                if finished:
                    scheduler.finish_deferred(finished, end_s)
                    for request in finished:
                        self.backend.free(request)
                    kv_blocks_used, num_running = bm.num_used_blocks, len(scheduler.running)
            record(pack(
                start_s, duration_s, batch_size, num_tokens, prefill_tokens, decode_seqs,
                padding_rows, kv_blocks_used, num_waiting, num_running, num_preempted))
            if on_step is not None:
                on_step(end_s, finished)
        return end_s

    def begin_quiet_step(self) -> None:
        """Apply the start of a quiet step (sim.replay.coast): the deferred rows' new KV blocks."""
        deferred = self.scheduler.deferred
        deferred.allocate(self.scheduler.block_manager.try_allocate, _no_room, None)


def _no_room(request: Request, num_tokens: int, plan: BatchPlan) -> bool:
    raise RuntimeError(f"a quiet step found no KV block for {request.request_id}")


def run_now(step: Generator[Any, Any, list[Request] | None]) -> list[Request] | None:
    """Run Engine.step on a clock whose wait never returns an event (a wall clock: the
    backend's execute already took the step's time); its result."""
    try:
        next(step)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a wall-clock wait must not return an event")
