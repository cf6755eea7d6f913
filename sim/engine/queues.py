"""Waiting-queue orders: which waiting request the scheduler admits next (`--queue`).

The batching policy decides how a step is packed; the queue decides who goes first:
- fcfs: arrival order; a preempted request goes back to the front.
- priority: lowest `priority` value first (vLLM's convention), arrival order within a class.
- fair: Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models",
  OSDI'24): each tenant's counter adds the service it received, input tokens weighted 1 and
  output tokens 2 (the paper's weights), and the tenant with the smallest counter goes
  next; a tenant that returns from idle has its counter lifted to the smallest counter of
  the tenants waiting, so idling banks no credit.
- sjf: shortest predicted remaining output first; the prediction is the true length times
  exp(noise x N(0, 1)), drawn per request from its id (noise 0: an oracle).
Aging bounds starvation in every order: once a request has waited `aging_s`, no request
that arrived after it is admitted before it (the overdue are served in arrival order).

A queue also names the eviction victim when KV runs short: the running request it would
serve last (the newest under fcfs and sjf, the newest of the lowest priority class, the
newest of the tenant furthest over its fair share), so that eviction never undoes the order
the queue just chose.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
from bisect import insort_right
from collections import deque
from collections.abc import Callable, Iterator

import numpy as np

from sim.engine.core import BatchPlan, Request

QUEUES = ("fcfs", "priority", "fair", "sjf")  # the `--queue` orders (make_queue)

FAIR_INPUT_WEIGHT = 1.0  # VTC's weight of a prompt token served
FAIR_OUTPUT_WEIGHT = 2.0  # and of an output token (decode costs more per token)


class _RunningOrder:
    """What every queue does with the running batch unless it orders it otherwise."""

    # Whether running stays sorted by priority (then admission) rather than by admission.
    sorts_running = False
    allows_fast_forward = True  # keeps no per-row state a fast-forwarded row would miss

    def place(self, running: list[Request], request: Request) -> None:
        """Put a request admitted now into the running batch."""
        running.append(request)

    def victim(self, running: list[Request]) -> Request:
        """The running request to evict first: the one this queue would serve last."""
        return running[-1]  # the newest admitted

    def preempts(self, request: Request, victim: Request) -> bool:  # noqa: ARG002
        """Whether waiting `request` may evict running `victim` to be admitted."""
        return False

    # Counts the service of a step about to be applied; None: this order keeps none (only
    # a fair queue does).
    charge_step: Callable[[BatchPlan], None] | None = None

    def forget(self, request: Request) -> None:
        """request finished: drop what the queue kept about it."""


class FcfsQueue(_RunningOrder, deque):
    """Arrival order: a deque, so the common case costs what it always did."""

    def head(self, now: float) -> Request | None:  # noqa: ARG002 - same signature as the rest
        """The request to admit next (None when empty)."""
        return self[0] if self else None

    def take(self, request: Request) -> None:
        """Remove `request`, the head just returned."""
        self.popleft()


class _AgedQueue(_RunningOrder):
    """A queue with its own order plus arrival-order aging; entries are removed lazily."""

    def __init__(self, aging_s: float) -> None:
        self.aging_s = aging_s
        self._live: dict[str, int] = {}  # request id -> its current entry's number
        # (arrival_s, number, request), a heap: the oldest waiting request, for aging. A
        # preempted request re-enters at its arrival time, behind older ones still waiting.
        self._arrivals: list[tuple[float, int, Request]] = []
        self._numbers = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __iter__(self) -> Iterator[Request]:
        """The waiting requests in arrival order."""
        return (r for _, n, r in sorted(self._arrivals) if self._valid(n, r))

    def append(self, request: Request) -> None:
        """A new arrival."""
        self._enter(request, front=False)

    def appendleft(self, request: Request) -> None:
        """A preempted request: ahead of the later arrivals of its class or tenant."""
        self._enter(request, front=True)

    def _enter(self, request: Request, front: bool) -> None:
        number = next(self._numbers)
        self._live[request.request_id] = number
        heapq.heappush(self._arrivals, (request.arrival_s, number, request))
        self._add(number, request, front)

    def remove(self, request: Request) -> None:
        if self._live.pop(request.request_id, None) is None:
            raise ValueError(f"request {request.request_id} is not waiting")

    def take(self, request: Request) -> None:
        self.remove(request)

    def head(self, now: float) -> Request | None:
        """The oldest request if it is overdue, else the first in this queue's order."""
        arrivals = self._arrivals
        while arrivals and not self._valid(arrivals[0][1], arrivals[0][2]):
            heapq.heappop(arrivals)
        if not arrivals:
            return None
        arrival_s, _, oldest = arrivals[0]
        if now - arrival_s >= self.aging_s:
            return oldest
        return self._first()

    def _valid(self, number: int, request: Request) -> bool:
        return self._live.get(request.request_id) == number

    def _add(self, number: int, request: Request, front: bool) -> None:
        raise NotImplementedError

    def _first(self) -> Request:
        raise NotImplementedError


class KeyedQueue(_AgedQueue):
    """Smallest key first (priority, or predicted remaining output), then arrival order
    (so a preempted request goes ahead of its class's later arrivals)."""

    def __init__(self, order: str, aging_s: float, sjf_noise: float = 0.0) -> None:
        super().__init__(aging_s)
        self.order, self.sjf_noise = order, sjf_noise
        self._heap: list[tuple[float, float, int, Request]] = []
        # Under priority the running batch stays sorted by priority (stable), so its tail,
        # the victim, is the newest of the lowest class.
        self.sorts_running = order == "priority"

    def place(self, running: list[Request], request: Request) -> None:
        if self.sorts_running:
            insort_right(running, request, key=_priority)
        else:
            running.append(request)

    def preempts(self, request: Request, victim: Request) -> bool:
        """Under priority, a request of a strictly higher class may evict (vLLM's rule)."""
        return self.sorts_running and victim.priority > request.priority

    def _add(self, number: int, request: Request, front: bool) -> None:
        entry = (self._key(request), request.arrival_s, number, request)
        heapq.heappush(self._heap, entry)

    def _key(self, request: Request) -> float:
        if self.order == "priority":
            return request.priority
        remaining = predicted_output_len(request, self.sjf_noise) - request.num_output_tokens
        return max(remaining, 1.0)

    def _first(self) -> Request:
        heap = self._heap
        while not self._valid(heap[0][2], heap[0][3]):
            heapq.heappop(heap)
        return heap[0][3]


class FairQueue(_AgedQueue):
    """Virtual Token Counter over tenants; arrival order within a tenant."""

    allows_fast_forward = False  # it charges every row's tokens each step

    def __init__(self, aging_s: float) -> None:
        super().__init__(aging_s)
        self.counters: dict[str, float] = {}  # tenant -> weighted tokens served
        self._tenants: dict[str, deque[tuple[int, Request]]] = {}
        # request id -> the sequence length already charged: a request recomputed after
        # eviction is not charged again for tokens it had been served once.
        self._served: dict[str, int] = {}

    def _add(self, number: int, request: Request, front: bool) -> None:
        tenant = request.tenant
        queue = self._tenants.setdefault(tenant, deque())
        self._drop_stale(queue)
        if not queue:  # back from idle: no credit for the time it sent nothing
            waiting = [self.counters.get(t, 0.0) for t, q in self._tenants.items()
                       if t != tenant and self._drop_stale(q)]
            lifted = min(waiting, default=0.0)
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), lifted)
        if front:  # preempted: ahead of its tenant's later arrivals
            queue.appendleft((number, request))
        else:
            queue.append((number, request))

    def _drop_stale(self, queue: deque[tuple[int, Request]]) -> bool:
        while queue and not self._valid(*queue[0]):
            queue.popleft()
        return bool(queue)

    def _first(self) -> Request:
        waiting = [t for t, q in self._tenants.items() if self._drop_stale(q)]
        tenant = min(waiting, key=lambda t: self.counters.get(t, 0.0))
        return self._tenants[tenant][0][1]

    def victim(self, running: list[Request]) -> Request:
        """The newest running request of the tenant with the largest counter."""
        counters = self.counters
        victim, most = running[-1], -math.inf
        for request in reversed(running):
            counter = counters.get(request.tenant, 0.0)
            if counter > most:
                victim, most = request, counter
        return victim

    def charge_step(self, plan: BatchPlan) -> None:  # type: ignore[override] - (the hook)
        for request, n in zip(plan.requests, plan.num_scheduled_tokens.values(), strict=True):
            self.charge(request, n)

    def charge(self, request: Request, num_tokens: int) -> None:
        """Count num_tokens computed for request, from its num_computed_tokens on, less
        the tokens it had been served before an eviction made it compute them again."""
        end = request.num_computed_tokens + num_tokens
        start = max(request.num_computed_tokens, self._served.get(request.request_id, 0))
        if end <= start:
            return
        self._served[request.request_id] = end
        prompt = max(0, min(end, request.prompt_len) - start)
        cost = FAIR_INPUT_WEIGHT * prompt + FAIR_OUTPUT_WEIGHT * (end - start - prompt)
        self.counters[request.tenant] = self.counters.get(request.tenant, 0.0) + cost

    def forget(self, request: Request) -> None:
        self._served.pop(request.request_id, None)


def _priority(request: Request) -> int:
    return request.priority


def predicted_output_len(request: Request, noise: float) -> float:
    """The output length an SJF scheduler believes: true length x exp(noise x z), z drawn
    from the request's id, so the same request gets the same guess in every run."""
    if noise == 0:
        return float(request.max_new_tokens)
    digest = hashlib.blake2b(request.request_id.encode(), digest_size=8).digest()
    z = np.random.default_rng(int.from_bytes(digest, "little")).standard_normal()
    return request.max_new_tokens * math.exp(noise * z)


WaitingQueue = FcfsQueue | KeyedQueue | FairQueue


def make_queue(order: str, aging_s: float, sjf_noise: float = 0.0) -> WaitingQueue:
    """The waiting queue for `--queue order`."""
    if order == "fcfs":
        return FcfsQueue()
    if order == "fair":
        return FairQueue(aging_s)
    if order in ("priority", "sjf"):
        return KeyedQueue(order, aging_s, sjf_noise)
    raise ValueError(f"unknown queue {order!r}; choose from {', '.join(QUEUES)}")
