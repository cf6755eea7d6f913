"""The engine step, shared by every time driver: schedule -> execute -> wait -> update.

`Engine.step` is the step of the simulator, the cluster, the measured run and the HTTP
server's engine thread; they differ only in the `wait` they pass, that is, in how they let
a step's time pass. `Engine.finish_step` records each step it applies (sim.engine.step_log); the
steps of a fast-forward run, priced at once, are recorded as the run applies them
(sim.engine.fast_forward_run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from sim.engine.core import (
    Backend,
    BatchPlan,
    PricesDecodeRuns,
    Request,
    StepResult,
    reads_rows,
    schedules_ahead,
)
from sim.engine.scheduler import Scheduler
from sim.engine.step_log import StepLog, pack

# How a driver lets a step's time pass, given the step's start and duration: the event its
# event loop waits on before the step is applied (a SimPy timeout), or None to apply it at
# once (a wall clock, whose backend already took the time; a simulator with no arrival
# inside the step).
Wait = Callable[[float, float], Any]

@dataclass
class Engine:
    """A scheduler and a backend; records one row per executed step."""

    scheduler: Scheduler
    backend: Backend
    steps: StepLog = field(default_factory=StepLog)
    # Whether a replay (sim.replay.simulation, sim.cluster.run) may fast-forward decode rows
    # (sim.engine.fast_forward) where the backend prices a plan from its totals alone: the
    # same decisions, made faster. False lists every row in every plan (to compare).
    allow_fast_forward: bool = True
    # The backend's PricesDecodeRuns.decode_steps_s, None without it (fast-forward runs
    # price their steps with it: resolved once, not per run).
    decode_run_price: Callable[[int, int, int], list[float]] | None = field(init=False)
    # An engine that schedules ahead (sim.engine.core.SchedulesAhead: vLLM's async
    # scheduling) planned the step after the one in flight when that one started: a request
    # that arrives during a step waits here, [request, steps still to skip], and joins the
    # scheduler for the step after next, or as soon as the scheduler has nothing else to run
    # (its planned step was empty).
    held: list[list] = field(init=False, default_factory=list)
    busy_until: float = field(init=False, default=-math.inf)  # end of the step in flight

    def __post_init__(self) -> None:
        backend = self.backend
        self.decode_run_price = (backend.decode_steps_s
                                 if isinstance(backend, PricesDecodeRuns) else None)

    def add(self, request: Request, now: float | None = None) -> bool:
        """Queue a request that arrives at `now` (None: at once, as a wall-clock engine
        does); False if it was rejected (it can never fit). An engine that schedules ahead
        holds one that arrives while a step runs (see `held`)."""
        scheduler = self.scheduler
        if (now is None or now >= self.busy_until or not schedules_ahead(self.backend)
                or scheduler.config.never_fits(request.prompt_len + request.max_new_tokens)):
            return scheduler.add(request)
        self.held.append([request, 1])
        return True

    def _release_held(self) -> None:
        """Hand the scheduler the held requests whose step has come (see `held`)."""
        scheduler = self.scheduler
        idle = not scheduler.running and not scheduler.waiting
        kept = []
        for entry in self.held:
            if idle or not entry[1]:
                scheduler.add(entry[0])
            else:
                entry[1] -= 1
                kept.append(entry)
        self.held = kept

    def schedule(self, now: float) -> BatchPlan | None:
        """The next step's plan, scheduled at `now`; None when there is nothing to run."""
        if self.held:
            self._release_held()
        plan = self.scheduler.schedule(now)
        # plan.is_empty, inlined (once per step); a step that only swaps KV out still runs.
        if (not plan.requests and not plan.unlisted_decodes and not plan.padding
                and not plan.swap_out):
            return None
        return plan

    def start_fast_forward(self) -> bool:
        """Fast-forward the scheduler's decode rows (sim.engine.fast_forward) from now on,
        where allow_fast_forward lets it and the backend prices a plan from its totals alone
        (a replay's choice, before its first request); returns whether it does."""
        if self.allow_fast_forward and not reads_rows(self.backend):
            return self.scheduler.start_fast_forward()
        return False

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
        self.busy_until = now + result.duration_s
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
        batch_size = len(plan.requests) + plan.unlisted_decodes + padding_rows
        num_tokens = prefill_tokens + decode_seqs
        kv_blocks_used = scheduler.block_manager.num_used_blocks
        num_waiting, num_running = len(scheduler.waiting), len(scheduler.running)
        num_preempted = len(plan.preempted)
        self.steps.add_packed(pack(
            start_s, duration_s, batch_size, num_tokens, prefill_tokens, decode_seqs,
            padding_rows, kv_blocks_used, num_waiting, num_running, num_preempted))
        return finished

    def retire(self, finished: list[Request], now: float) -> None:
        """Finish the rows a fast-forwarded step (sim.engine.fast_forward_run) that ended at
        `now` brought to max_new_tokens, as finish_step would."""
        self.scheduler.finish_at_length(finished, now)
        for request in finished:
            self.backend.free(request)


def run_now(step: Generator[Any, Any, list[Request] | None]) -> list[Request] | None:
    """Run Engine.step on a clock whose wait never returns an event (a wall clock: the
    backend's execute already took the step's time); its result."""
    try:
        next(step)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a wall-clock wait must not return an event")
