"""A fast-forward run: an engine's decode-only steps priced at once, applied as time reaches them.

Between the steps where the scheduler decides something (an arrival admitted, a prefill
chunk, a preemption), an engine whose decode rows are fast-forwarded (sim.engine.fast_forward)
only decodes them: each step's plan is the one before with every row a token longer, and
its one effect is a new KV block for the rows that fill their last, up to the step at whose
end rows finish or register a block in the prefix cache, which ends the run. A replay
prices such a run of steps in one go (the backend's decode_steps_s where it has one)
instead of scheduling, executing and recording each: one engine's replay runs it up to the
step in progress when the next request arrives (it knows when); in a cluster, the engine
sleeps once, until the last ends.

The steps' effects (blocks at each start, a step record and a step clock tick at each end,
the last one's finishes and registrations) are applied only when time passes them (`apply`),
so a router that reads the engine's load at an arrival sees them as of that instant (rows
finish only at a run's end, when its engine wakes), and an arrival routed to the engine
cuts the run at the step in progress (`cut`): the next step, which admits it, starts when
that one ends, exactly as if every step had been an event.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from itertools import accumulate
from typing import TYPE_CHECKING

from sim.engine.core import BatchPlan, Request
from sim.engine.fast_forward import DecodeFastForward
from sim.engine.step_log import pack

if TYPE_CHECKING:
    from sim.engine.step import Engine

OnStep = Callable[[float, list[Request]], None]

MAX_RUN_STEPS = 32  # steps priced ahead at most (an arrival wastes the rest)
# Steps of a run applied together at the least: fewer are applied one at a time, which costs
# less than gathering their blocks and records when there are few.
TOGETHER_MIN = 5


class FastForwardRun:
    """Fast-forwarded steps of one engine from start_s: ends[j] is when step j ends (step j
    starts when step j - 1 ends). Build one with `start`."""

    __slots__ = ("engine", "rows", "on_step", "start_s", "ends", "durations", "begun", "ended")

    def __init__(self, engine: Engine, rows: DecodeFastForward, start_s: float,
                 num_steps: int, on_step: OnStep | None, until: float = math.inf) -> None:
        self.engine, self.rows, self.on_step, self.start_s = engine, rows, on_step, start_s
        n, context, context_max = rows.decode_totals()
        price = engine.decode_run_price
        if price is not None:
            durations = price(n, context, num_steps)
        else:
            plan = BatchPlan(decode_seqs=n, num_sampled=n, unlisted_decodes=n)
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
        self.begun = 0  # steps whose start (new blocks) has been applied
        self.ended = 0  # steps whose end (record, step clock) has been applied

    @classmethod
    def start(cls, engine: Engine, start_s: float, on_step: OnStep | None = None,
              until: float = math.inf) -> FastForwardRun | None:
        """The fast-forwarded steps the engine has from start_s on (its next step's start),
        up to the one in progress at `until` if any is; None when it has fewer than two
        (one is no cheaper priced alone), or fast-forwards nothing (Engine.start_fast_forward)
        or has a request waiting or held."""
        scheduler = engine.scheduler
        rows = scheduler.fast_forward
        if rows is None or scheduler.waiting or engine.held:
            return None
        num_steps = rows.steps_ahead(MAX_RUN_STEPS)
        if num_steps < 2:
            return None
        run = cls(engine, rows, start_s, num_steps, on_step, until)
        engine.busy_until = run.end_s  # a request arriving within it comes mid-step
        return run

    @property
    def end_s(self) -> float:
        return self.ends[-1]

    def apply(self, now: float) -> None:
        """Apply every step start and step end before `now` (an arrival at the instant a
        step ends is delivered first: that step is still in progress)."""
        ends, first = self.ends, self.ended
        done = bisect.bisect_left(ends, now)  # steps that end before now
        if first < done:
            start = ends[first - 1] if first else self.start_s
            self._apply_steps(start, first, done)
            self.ended = done
            self.begun = max(self.begun, done)
        # The step in progress at `now` began if the one before it ended before now.
        if self.begun == done < len(ends) and (ends[done - 1] if done else self.start_s) < now:
            self.rows.allocate(_no_room, None)  # its start: the rows' new KV blocks
            self.begun = done + 1

    def cut(self, now: float) -> None:
        """A request joins the engine at `now`: the run stops with the step in progress."""
        del self.ends[bisect.bisect_left(self.ends, now) + 1:]
        self.engine.busy_until = self.ends[-1]

    def finish(self) -> None:
        """Apply every step of the run (at its end)."""
        self.apply(math.inf)

    def _apply_steps(self, start_s: float, first: int, last: int) -> None:
        """Apply steps first..last-1 (step j lasts durations[j] and starts at start_s, the
        end of step first - 1): at the start of each not yet begun (j >= begun) the rows'
        new KV blocks, at its end its token times, the rows it finished (the run's last
        step only) and its record."""
        engine, rows, durations = self.engine, self.rows, self.durations
        scheduler, bm, on_step = engine.scheduler, engine.scheduler.block_manager, self.on_step
        # Up to a step that changes rows at its end (a run's last) at once.
        count = min(last - first, rows.steps_before_event() + 1)
        while count >= TOGETHER_MIN:
            start_s = self._apply_together(start_s, first, first + count)
            first += count
            count = min(last - first, rows.steps_before_event() + 1)
        allocate, update, record = rows.allocate, rows.update, engine.steps.add_packed
        batch_size = decode_seqs = num_tokens = len(rows.rows)
        prefill_tokens = padding_rows = num_preempted = 0
        for j in range(first, last):
            if j >= self.begun:
                allocate(_no_room, None)
            duration_s = durations[j]
            end_s = start_s + duration_s
            finished = update(end_s)
            if finished:
                engine.retire(finished, end_s)
            kv_blocks_used = bm.num_used_blocks
            num_waiting, num_running = len(scheduler.waiting), len(scheduler.running)
            record(pack(
                start_s, duration_s, batch_size, num_tokens, prefill_tokens, decode_seqs,
                padding_rows, kv_blocks_used, num_waiting, num_running, num_preempted))
            start_s = end_s
            if on_step is not None:
                on_step(end_s, finished)

    def _apply_together(self, start_s: float, first: int, last: int) -> float:
        """_apply_steps for steps first..last-1, of which only the last may change rows at
        its end: their blocks in one pass (in the order a step at a time takes them), then
        each one's record and on_step in turn, the last one's row events before its own;
        returns when the last ends."""
        engine, rows, on_step = self.engine, self.rows, self.on_step
        scheduler, bm = engine.scheduler, engine.scheduler.block_manager
        used_before = bm.num_used_blocks
        taken = rows.allocate_steps(max(self.begun - first, 0), last - first)
        if taken is None:
            raise RuntimeError("a fast-forwarded step found no KV block")
        batch_size = decode_seqs = num_tokens = len(rows.rows)
        prefill_tokens = padding_rows = num_preempted = 0
        num_waiting, num_running = len(scheduler.waiting), len(scheduler.running)
        durations = self.durations[first:last]
        ends = list(accumulate(durations, initial=start_s))  # (the same sums)
        starts = ends[:-1]
        del ends[0]
        rows.advance(ends[:-1])
        record, final = engine.steps.add_packed, last - first - 1
        used = [used_before + n for n in taken]
        finished: list[Request] = []
        for j, (start_s, duration_s, end_s, kv_blocks_used) in enumerate(
                zip(starts, durations, ends, used, strict=True)):
            if j == final:  # the last step: its row events first
                finished = rows.update(end_s)
                if finished:
                    engine.retire(finished, end_s)
                    kv_blocks_used, num_running = bm.num_used_blocks, len(scheduler.running)
            record(pack(
                start_s, duration_s, batch_size, num_tokens, prefill_tokens, decode_seqs,
                padding_rows, kv_blocks_used, num_waiting, num_running, num_preempted))
            if on_step is not None:
                on_step(end_s, finished)
        return end_s


def _no_room(request: Request, num_tokens: int, plan: BatchPlan | None) -> bool:
    raise RuntimeError(f"a fast-forwarded step found no KV block for {request.request_id}")
