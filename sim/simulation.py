"""The SimPy loop: an arrival process releases trace requests, an engine process steps.

The engine waits on an arrival event when idle (no polling) and advances the clock by each
step's duration, predicted by a cost model or measured by the executor: the same loop
gives simulated and measured runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import simpy

from sim.core import Request
from sim.engine import Engine


class StalledError(RuntimeError):
    """The scheduler has queued work but cannot make progress (a scheduler bug)."""


@dataclass
class RunResult:
    """Every request (finished, rejected or not) and the engine's per-step records."""

    requests: list[Request]
    steps: list[tuple]
    num_preemptions: int
    num_blocks: int
    max_num_seqs: int


def run_trace(
    requests: Sequence[Request],
    engine: Engine,
    on_step: Callable[[float, list[Request]], None] | None = None,
) -> RunResult:
    """Replay requests (sorted by arrival_s) through the engine until all have finished.

    on_step, if given, is called after every step with the time and the finished requests.
    """
    env = simpy.Environment()
    wake: list[simpy.Event] = []  # the event an idle engine sleeps on, if any
    arrived = [0]
    num_requests = len(requests)

    def arrivals():
        for request in requests:
            delay = request.arrival_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            engine.add(request)
            arrived[0] += 1
            if wake:
                wake.pop().succeed()

    def stepping():
        scheduler = engine.scheduler
        now = env.now  # the engine's clock: ahead of env.now while it runs steps ahead
        while True:
            stepped = engine.plan(now)
            if stepped is None:
                if now > env.now:  # catch SimPy up before sleeping
                    yield env.timeout(now - env.now)
                    continue
                if arrived[0] == num_requests and not scheduler.has_unfinished:
                    return
                if scheduler.has_unfinished and not scheduler.running:
                    raise StalledError(
                        f"t={now:.3f}s: {len(scheduler.waiting)} waiting, none admissible"
                    )
                wake.append(env.event())
                yield wake[-1]
                now = env.now
                continue
            plan, result = stepped
            end_s = now + result.duration_s
            # Only an arrival changes what the scheduler decides next, so steps run back
            # to back without a SimPy event each until one lands within a step; then SimPy
            # delivers it (and any before it) first, as if every step had been an event.
            if arrived[0] < num_requests and requests[arrived[0]].arrival_s <= end_s:
                yield env.timeout(max(0.0, end_s - env.now))
            finished = engine.finish_step(plan, result, now)
            now = end_s
            if on_step is not None:
                on_step(now, finished)

    env.process(arrivals())
    done = env.process(stepping())
    env.run(until=done)
    scheduler = engine.scheduler
    return RunResult(
        requests=list(requests),
        steps=engine.steps,
        num_preemptions=scheduler.num_preemptions,
        num_blocks=scheduler.config.num_blocks,
        max_num_seqs=scheduler.config.max_num_seqs,
    )
