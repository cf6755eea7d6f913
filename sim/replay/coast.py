"""Quiet steps: a run of an engine's steps priced at once, applied as time reaches them.

Between the steps where the scheduler decides something (an arrival admitted, a prefill
chunk, a preemption), an engine that defers its decode rows (sim.engine.deferred) only decodes
them: each step's plan is the one before with every row a token longer, and its one effect
is a new KV block for the rows that fill their last, up to the step at whose end rows
finish or register a block in the prefix cache, which ends the run. A replay prices such
a run of steps in one go (the backend's decode_steps_s where it has one) instead of
scheduling, executing and recording each: one engine's replay runs it up to the step in
progress when the next request arrives (it knows when); in a cluster, the engine sleeps
once, until the last ends.

The steps' effects (blocks at each start, a step record and a step clock tick at each end,
the last one's finishes and registrations) are applied only when time passes them (`apply`),
so a router that reads the engine's load at an arrival sees them as of that instant (rows
finish only at a run's end, when its engine wakes), and an arrival routed to the engine
cuts the run at the step in progress (`cut`): the next step, which admits it, starts when
that one ends, exactly as if every step had been an event. tests/sim/replay/test_coast.py holds
both replays to the decisions of stepping one event at a time, arrivals on step ends too.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from itertools import accumulate

from sim.engine.core import BatchPlan, Request
from sim.engine.step import Engine

MAX_QUIET_STEPS = 32  # steps priced ahead at most (an arrival wastes the rest)


class QuietRun:
    """Quiet steps of one engine from start_s: ends[j] is when step j ends (step j starts
    when step j - 1 ends). Build one with `start`."""

    __slots__ = ("engine", "on_step", "start_s", "ends", "durations", "n", "begun", "ended")

    def __init__(self, engine: Engine, start_s: float, num_steps: int,
                 on_step: Callable[[float, list[Request]], None] | None,
                 until: float = math.inf) -> None:
        self.engine, self.on_step, self.start_s = engine, on_step, start_s
        n, context, context_max = engine.scheduler.deferred.decode_totals()
        price = engine.decode_run_price
        if price is not None:
            durations = price(n, context, num_steps)
        else:
            plan = BatchPlan(decode_seqs=n, num_sampled=n, deferred_decodes=n)
            durations, end = [], start_s
            for j in range(num_steps):  # the plan each step would be given
                plan.decode_context = context + n * j
                plan.decode_context_max = context_max + j
                durations.append(engine.execute(plan).duration_s)
                end = end + durations[-1]
                if end >= until:  # (no plan priced past it: a backend may count them)
                    break
        ends = list(accumulate(durations, initial=start_s))  # (the same sums, one by one)
        del ends[0]
        if until != math.inf:
            last = bisect.bisect_left(ends, until)  # the step in progress at `until`, if any
            del ends[last + 1:], durations[last + 1:]
        self.ends, self.durations = ends, durations
        self.n = n
        self.begun = 0  # steps whose start (new blocks) has been applied
        self.ended = 0  # steps whose end (record, step clock) has been applied

    @classmethod
    def start(cls, engine: Engine, start_s: float,
              on_step: Callable[[float, list[Request]], None] | None = None,
              until: float = math.inf) -> QuietRun | None:
        """The quiet steps the engine has from start_s on (its next step's start), up to
        the one in progress at `until` if any is; None when it has fewer than two quiet
        steps (one is no cheaper priced alone)."""
        num_steps = engine.scheduler.quiet_steps(MAX_QUIET_STEPS)
        return cls(engine, start_s, num_steps, on_step, until) if num_steps > 1 else None

    @property
    def end_s(self) -> float:
        return self.ends[-1]

    def apply(self, now: float) -> None:
        """Apply every step start and step end before `now` (an arrival at the instant a
        step ends is delivered first: that step is still in progress)."""
        engine, ends, first = self.engine, self.ends, self.ended
        done = bisect.bisect_left(ends, now)  # steps that end before now
        if first < done:
            start = ends[first - 1] if first else self.start_s
            engine.quiet_steps(start, self.durations, first, done, self.begun, self.on_step)
            self.ended = done
            self.begun = max(self.begun, done)
        # The step in progress at `now` began if the one before it ended before now.
        if self.begun == done < len(ends) and (ends[done - 1] if done else self.start_s) < now:
            engine.begin_quiet_step()
            self.begun = done + 1

    def cut(self, now: float) -> None:
        """A request joins the engine at `now`: the run stops with the step in progress."""
        del self.ends[bisect.bisect_left(self.ends, now) + 1:]

    def finish(self) -> None:
        """Apply every step of the run (at its end)."""
        self.apply(math.inf)
