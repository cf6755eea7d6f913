"""Decode fast-forward: the scheduler's decode rows kept out of the plans, for a cost model.

A running request whose KV covers all but its last token (a decode) does the same thing
every step until it leaves: one token computed, one token time, one more KV slot. A cost
model prices a step from the plan's totals alone, so when the backend is one, the scheduler
keeps such rows out of the plan's row lists and out of its per-row loops:
  - the plan's decode totals come from running sums (a row's length grows by one per step,
    so the sum of lengths is sum(k) + rows x step and the longest is max(k) + step);
  - a row's token times are the step end times of the steps it ran, copied from the
    engine's step clock when it leaves (finishes or is preempted);
  - the only per-row work is at the steps where something happens to a row, known when it
    starts decoding: it needs a new KV block, it fills one (prefix caching registers it),
    or it reaches max_new_tokens. Those events run in the running queue's order, as the
    per-row loops visit them, so every allocation, eviction and cache registration happens
    in the same order and with the same outcome as with every row listed.
Between the steps where the scheduler decides something, the steps only decode these rows:
a replay prices a run of them at once (sim.engine.fast_forward_run).
"""

from __future__ import annotations

import heapq
import itertools
from bisect import insort

from sim.engine.batch_plan import MakeRoom, add_chunks
from sim.engine.block_hashes import num_shareable_blocks
from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, Request

_CACHE, _FINISH = 0, 1  # update events of one row at one step: its block first, then the end


class _Row:
    """One fast-forwarded decode: its length at step s is k + s; it joined at step `start`."""

    __slots__ = ("request", "key", "start", "k", "alive", "shareable")

    def __init__(self, request: Request, key: object, start: int, k: int,
                 shareable: int) -> None:
        self.request, self.key, self.start, self.k, self.alive = request, key, start, k, True
        self.shareable = shareable  # blocks prefix caching may register (block_hashes)


def _running_order(row: _Row) -> object:
    return row.key


class DecodeFastForward:
    """The fast-forwarded decode rows of one scheduler, and its other running rows in order."""

    def __init__(self, block_manager: BlockManager, on_demand: bool, by_priority: bool):
        self.block_manager = block_manager
        self.block_size = block_manager.block_size
        self.on_demand = on_demand  # KV allocated as sequences grow (not reserved up front)
        self.caching = block_manager.enable_caching
        self.by_priority = by_priority  # running is sorted by priority, then admission
        self.step = 0  # steps applied so far; the next step to run has this index
        self.ends: list[float] = []  # the end time of every step applied
        self.rows: dict[str, _Row] = {}
        self.others: dict[str, Request] = {}  # running, not a row (chunks left), by admission
        self.keys: dict[str, object] = {}  # every running request's place in the running queue
        self._order = itertools.count()
        self.k_sum = 0
        self._k_max: list[tuple[int, object, _Row]] = []  # (-k, key, row), stale entries skipped
        # Rows by the step (mod block_size) at which each needs a new block: a row of length
        # k + s at step s does when its KV (k + s - 1 tokens) fills its last. Running order
        # within each; rows that left are dropped as they are met.
        self._due: list[list[_Row]] = [[] for _ in range(self.block_size)]
        self._events: list[tuple[int, object, int, _Row]] = []  # (step, key, kind, row)
        self.counted = False  # whether the plan being built holds the rows in its totals

    # ---- rows in and out -----------------------------------------------------------------

    def started(self, request: Request) -> None:
        """request was admitted (appended to running, or inserted by priority)."""
        order = next(self._order)
        self.keys[request.request_id] = (request.priority, order) if self.by_priority else order
        self.others[request.request_id] = request

    def adopt(self, requests: list[Request]) -> None:
        """Of the requests a step listed (and update applied), those still running that now
        decode (KV for all but their last token) are rows from the next step on."""
        for request in requests:
            if (request.request_id in self.others
                    and request.num_computed_tokens + 1 == request.num_tokens):
                self._add_row(request)

    def _add_row(self, request: Request) -> None:
        """request, applied up to this step, decodes from the next one on."""
        rid = request.request_id
        del self.others[rid]
        start = self.step  # (update has moved the step on already)
        k = request.num_tokens - start
        key = self.keys[rid]
        row = _Row(request, key, start, k, num_shareable_blocks(request, self.block_size))
        self.rows[rid] = row
        self.k_sum += k
        heapq.heappush(self._k_max, (-k, key, row))
        bs = self.block_size
        if self.on_demand:
            due = self._due[(1 - k) % bs]
            if not due or due[-1].key < key:  # admitted after every row there (insort's end)
                due.append(row)
            else:
                insort(due, row, key=_running_order)
        # Its computed tokens (length after the step) fill a block; only blocks past those
        # computed so far (k + start - 1 tokens, registered up to `shareable`) can join.
        if self.caching and (k + start - 1) // bs < row.shareable:
            heapq.heappush(self._events, (start + (-k - start) % bs, key, _CACHE, row))
        remaining = request.max_new_tokens - len(request.token_times_s)
        heapq.heappush(self._events, (start + remaining - 1, key, _FINISH, row))

    def leave(self, request: Request, plan: BatchPlan | None = None) -> None:
        """request stops running now (finished, preempted, aborted): its state catches up to
        the steps applied, and the plan being built (if it counted the row) lets it go."""
        rid = request.request_id
        self.keys.pop(rid, None)
        if self.others.pop(rid, None) is not None:
            return
        row = self.rows.get(rid)
        if row is None:
            return
        self._drop(row, self.step)
        if plan is not None and self.counted:  # it was counted in this step's totals
            length = row.k + self.step
            plan.decode_seqs -= 1
            plan.num_sampled -= 1
            plan.decode_context -= length
            plan.unlisted_decodes -= 1

    def _drop(self, row: _Row, upto: int) -> None:
        """Catch row up with steps [start, upto) and stop fast-forwarding it."""
        request = row.request
        row.alive = False
        del self.rows[request.request_id]
        self.k_sum -= row.k
        request.token_times_s.extend(self.ends[row.start:upto])
        request.num_computed_tokens = row.k + upto - 1
        if len(self._k_max) > 2 * len(self.rows) + 64:  # forget the stale entries
            self._k_max = [e for e in self._k_max if e[2].alive]
            heapq.heapify(self._k_max)

    # ---- one step ------------------------------------------------------------------------

    def schedule_running(self, plan: BatchPlan, budget: int, make_room: MakeRoom,
                         chunk_room: MakeRoom | None) -> int:
        """The scheduler's running requests from `budget` tokens: every row in the plan's
        decode totals (after the blocks rows need this step, make_room evicting when the
        pool is short), then the others' prompt chunks (sim.engine.batch_plan.add_chunks,
        given chunk_room). Returns the budget left."""
        self.allocate(make_room, plan)
        self.counted = True
        n, context, context_max = self.decode_totals()
        if n:
            plan.decode_seqs += n
            plan.num_sampled += n
            plan.decode_context += context
            plan.decode_context_max = max(plan.decode_context_max, context_max)
            plan.unlisted_decodes = n
        budget -= n
        if self.others:
            others = list(self.others.values())
            if self.by_priority:
                others.sort(key=lambda r: self.keys[r.request_id])
            budget = add_chunks(plan, others, budget, chunk_room)
        return budget

    def allocate(self, make_room: MakeRoom, plan: BatchPlan | None) -> None:
        """Give the rows that fill their last block this step a new one, in running order
        (make_room, given plan, when the pool is short)."""
        step = self.step
        rows = self._due[step % self.block_size]
        try_allocate = self.block_manager.try_allocate
        left = False
        for row in rows:
            if row.alive:
                request = row.request
                length = row.k + step
                if try_allocate(request.request_id, length) or make_room(request, length, plan):
                    continue
            left = True
        if left:
            rows[:] = [row for row in rows if row.alive]

    def allocate_steps(self, skip: int, count: int) -> list[int] | None:
        """`allocate` for the `count` steps from this one on, the first `skip` of them
        already given theirs, in one call to the block manager (the blocks one allocation
        at a time would take, in order); how many blocks the steps took up to each one's,
        or None when the pool ran short (none taken). Only for steps no row event ends
        before the last of (steps_before_event): until the last one's end no row leaves
        and no block is freed. A due row needs exactly one block: on demand, its table
        holds the blocks of its computed tokens and no more."""
        step, due, bs = self.step, self._due, self.block_size
        grown: list[str] = []
        taken = [0] * skip
        for s in range(step + skip, step + count):
            rows = due[s % bs]
            ids = [row.request.request_id for row in rows if row.alive]
            if len(ids) != len(rows):  # rows that left are dropped as they are met
                rows[:] = [row for row in rows if row.alive]
            grown += ids
            taken.append(len(grown))
        return taken if self.block_manager.add_blocks(grown) else None

    def steps_before_event(self) -> int:
        """Steps from this one on whose end changes no row (no block registered, no row
        finished): they may be applied together (advance)."""
        events = self._events
        return events[0][0] - self.step if events else 1 << 62

    def advance(self, ends: list[float]) -> None:
        """`update` for steps that end at `ends`, fewer than steps_before_event."""
        self.ends.extend(ends)
        self.step += len(ends)
        self.counted = False

    def decode_totals(self) -> tuple[int, int, int]:
        """This step's rows: how many, the sum of their lengths, the longest."""
        n = len(self.rows)
        if not n:
            return 0, 0, 0
        k_max = self._k_max
        while not k_max[0][2].alive:
            heapq.heappop(k_max)
        step = self.step
        return n, self.k_sum + n * step, step - k_max[0][0]

    def steps_ahead(self, limit: int) -> int:
        """How many steps from this one (at most limit) only decode the rows, with nothing
        happening to any row but a new block that the pool is sure to hold, except at the
        end of the last: 0 while a running request is not a row (a prefill chunk runs) or
        none is. (The scheduler's waiting queue is the caller's to check.)"""
        n = len(self.rows)
        if self.others or not n:
            return 0
        if self._events:  # rows finish or register cached blocks at the last step's end
            limit = min(limit, self._events[0][0] - self.step + 1)
        if self.on_demand:  # each row takes at most one block per block_size steps
            limit = min(limit, self.block_manager.num_free_blocks // n * self.block_size)
        return max(limit, 0)

    def update(self, now: float) -> list[Request]:
        """Apply the step that ended at `now` to the rows: block registrations in running
        order, and returns the rows that reached max_new_tokens (caught up, no longer rows;
        finishing them after the registrations changes nothing: freeing a block neither
        adds nor drops a cache key). Rows adopted from here on start at the next."""
        step, events, bs = self.step, self._events, self.block_size
        finished = []
        self.ends.append(now)
        while events and events[0][0] == step:
            _, key, kind, row = heapq.heappop(events)
            if not row.alive:
                continue
            if kind == _CACHE:
                computed = row.k + step
                self.block_manager.cache_blocks(row.request, computed)
                # Past the shareable blocks only a preempted row's own recompute could use
                # more, and cache_blocks registers none of those: no event until it leaves.
                if computed // bs < row.shareable:
                    heapq.heappush(events, (step + bs, key, _CACHE, row))
            else:
                self._drop(row, step + 1)
                finished.append(row.request)
        self.step = step + 1
        self.counted = False
        return finished
