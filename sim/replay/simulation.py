"""The SimPy loop: an arrival process releases trace requests, an engine process steps.

The engine waits on an arrival event when idle (no polling) and advances the clock by each
step's duration, predicted by a cost model or measured by the executor: the same loop
gives simulated and measured runs.
"""

from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import simpy

from sim.engine.core import Request, request_overhead_s
from sim.engine.fast_forward_run import FastForwardRun
from sim.engine.step import Engine
from sim.engine.step_log import StepLog


class StalledError(RuntimeError):
    """The scheduler has queued work but cannot make progress (a scheduler bug)."""


@dataclass
class RunResult:
    """Every request (finished, rejected or not) and the engine's per-step records."""

    requests: list[Request]
    steps: StepLog  # (or a list of StepRecord)
    num_preemptions: int
    num_blocks: int
    max_num_seqs: int
    # When an SLO watch (sim.replay.verdict) stopped the replay, certain it fails; None: it ran
    # to the end.
    stopped_s: float | None = None


class ReplayEnvironment(simpy.Environment):
    """SimPy's environment, closing the processes a replay started once it ends.

    A replay stopped before its processes end (an SLO watch certain of its verdict, an
    error) leaves them suspended on the events they wait for, which the environment's
    queue holds, and each event holds its process: the engines and every request in flight
    stay in that cycle until the cyclic collector finds it, scanned on every pass till
    then. Closing the generators frees it all by reference counting. (A replay that ran to
    its end leaves at most idle engines suspended, waiting for requests that never come.)"""

    def __init__(self) -> None:
        super().__init__()
        # SimPy binds its event factories to the instance for speed, those its own class
        # names: bind the two a replay calls for every step here too.
        self.timeout, self.event = self.timeout, self.event
        # Weakly: a process that ended is dropped (P/D starts one per request).
        self._generators: weakref.WeakSet[Generator] = weakref.WeakSet()

    def process(self, generator: Generator) -> simpy.Process:  # type: ignore[override]
        self._generators.add(generator)
        return simpy.Process(self, generator)

    def close(self) -> None:
        """End every process still suspended."""
        for generator in list(self._generators):
            generator.close()


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a replay runs. None of the objects that exist before
    it (the trace's requests, their lists) becomes garbage during it, and what it creates is
    freed by reference counting (a 30,000-request cluster replay leaves about 200 objects in
    cycles, collected after it). What it keeps is what every collector pass would scan again
    (each request's token times, a list per request), so the passes grew with the run (15% of
    a 300,000-request cluster replay when step records were objects too). Building a trace's
    requests (sim.replay.workload) creates no garbage either, only what the passes would rescan:
    20,000 of them took 23 ms paused, 29-180 ms with the collector running."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_trace(
    requests: Sequence[Request],
    engine: Engine,
    on_step: Callable[[float, list[Request]], None] | None = None,
) -> RunResult:
    """Replay requests (sorted by arrival_s) through the engine until all have finished.

    on_step, if given, is called after every step with the time and the finished requests.
    With a cost model, the engine fast-forwards its decode rows (Engine.allow_fast_forward).
    """
    engine.start_fast_forward()
    env = ReplayEnvironment()
    replay = _Replay(env, requests, engine, on_step)
    env.process(replay.arrivals())
    try:
        with collector_paused():
            env.run(until=env.process(replay.stepping()))
    finally:
        env.close()
    scheduler = engine.scheduler
    return RunResult(
        requests=list(requests),
        steps=engine.steps,
        num_preemptions=scheduler.num_preemptions,
        num_blocks=scheduler.config.num_blocks,
        max_num_seqs=scheduler.config.max_num_seqs,
    )


class _Replay:
    """The two SimPy processes of one replay: arrivals release requests at their times, and
    the engine steps while it has work, sleeping on an arrival event when it has none."""

    def __init__(self, env: simpy.Environment, requests: Sequence[Request], engine: Engine,
                 on_step: Callable[[float, list[Request]], None] | None) -> None:
        self.env, self.requests, self.engine, self.on_step = env, requests, engine, on_step
        self.wake: list[simpy.Event] = []  # the event an idle engine sleeps on, if any
        self.arrived = 0
        self.end_s = 0.0  # when the step in progress ends (the engine's clock)
        # A server's own path from the socket to its scheduler (a calibration from its URL
        # measures it): the scheduler sees each request this much after it arrived.
        self.delay_s = request_overhead_s(engine.backend)
        self.next_arrival_s = math.inf  # when the scheduler sees the next request
        self._set_next_arrival()

    def _set_next_arrival(self) -> None:
        requests, arrived = self.requests, self.arrived
        self.next_arrival_s = (requests[arrived].arrival_s + self.delay_s
                               if arrived < len(requests) else math.inf)

    def arrivals(self):
        env = self.env
        for request in self.requests:
            delay = request.arrival_s + self.delay_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            self.engine.add(request, env.now)
            self.arrived += 1
            self._set_next_arrival()
            if self.wake:
                self.wake.pop().succeed()

    def stepping(self):
        env, engine, requests = self.env, self.engine, self.requests
        scheduler = engine.scheduler
        num_requests = len(requests)
        now = env.now  # the engine's clock: ahead of env.now while it runs steps ahead
        while True:
            arrival = self.next_arrival_s
            # Fast-forwarded steps, up to the one in progress when the next request arrives.
            run = FastForwardRun.start(engine, now, self.on_step, arrival)
            if run is not None:
                if arrival <= run.end_s:  # it lands in the last step: delivered first
                    run.apply(arrival)
                    yield env.timeout(max(0.0, run.end_s - env.now))
                run.finish()
                now = run.end_s
                continue
            finished = yield from engine.step(now, self.wait)
            if finished is None:
                if now > env.now:  # catch SimPy up before sleeping
                    yield env.timeout(now - env.now)
                    continue
                if self.arrived == num_requests and not scheduler.has_unfinished:
                    return
                if scheduler.has_unfinished and not scheduler.running:
                    raise StalledError(
                        f"t={now:.3f}s: {len(scheduler.waiting)} waiting, none admissible"
                    )
                self.wake.append(env.event())
                yield self.wake[-1]
                now = env.now
                continue
            now = self.end_s
            if self.on_step is not None:
                self.on_step(now, finished)

    def wait(self, start_s: float, duration_s: float) -> simpy.Event | None:
        """A step's wait (sim.engine.step.Wait). Only an arrival changes what the scheduler decides
        next, so steps run back to back without a SimPy event each until one lands within a
        step; then SimPy delivers it (and any before it) first, as if every step had been an
        event."""
        end_s = self.end_s = start_s + duration_s
        if self.next_arrival_s <= end_s:
            return self.env.timeout(max(0.0, end_s - self.env.now))
        return None
