"""The router in front of a cluster's replicas: one component, four policies (ROUTER_POLICIES).

A router sees a request and a snapshot of each replica's load (and, for the prefix-aware
router, how much of the request's prompt each replica's prefix cache holds) and returns a
replica index. The simulator fills the snapshot from its engines; `servelab route` fills it
from each upstream's `/metrics` and its own record of what it sent where.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple


class ReplicaLoad(NamedTuple):
    """One replica as a router sees it when a request arrives (a tuple: a cluster builds
    one per replica per arrival)."""

    num_running: int  # requests in the running batch
    num_waiting: int  # requests queued (preempted ones included)
    kv_usage: float  # fraction of the KV pool held by requests, in [0, 1]
    cached_tokens: int = 0  # prompt tokens of this request found in its prefix cache

    @property
    def num_requests(self) -> int:
        return self.num_running + self.num_waiting


@dataclass(frozen=True)
class RouterConfig:
    """Which router, and the weights of the prefix-aware router's scorers.

    The prefix-aware router adds three scores in [0, 1], as llm-d's inference scheduler
    and SGLang's cache-aware router balance cache affinity against load: the share of the
    prompt the replica has cached, its queue (1 for the least loaded replica, 0 for the
    most), and its free KV. A cached prompt is worth more than an even queue, but a
    replica with every request on it loses a prompt it holds only half of.
    """

    name: str = "round-robin"
    prefix_weight: float = 3.0
    queue_weight: float = 2.0
    kv_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in ROUTERS:
            raise ValueError(f"unknown router {self.name!r}; choose from {', '.join(ROUTERS)}")
        for key in ("prefix_weight", "queue_weight", "kv_weight"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"router {key} must be >= 0, got {getattr(self, key)}")


class Router:
    """Picks a replica per request; ties go to the next replica in turn, so an idle
    cluster spreads requests instead of piling them on replica 0."""

    def __init__(self, config: RouterConfig | str = "round-robin") -> None:
        self.config = RouterConfig(config) if isinstance(config, str) else config
        self.policy = ROUTER_POLICIES[self.config.name]()
        self._turn = 0  # where the next tie-break (or round-robin) scan starts

    @property
    def needs_loads(self) -> bool:
        """False for round-robin, which needs no snapshot (the caller may skip building it)."""
        return self.policy.needs_loads

    @property
    def needs_kv(self) -> bool:
        """True when ReplicaLoad.kv_usage must be filled in."""
        return self.policy.needs_kv

    @property
    def needs_prefix(self) -> bool:
        """True when ReplicaLoad.cached_tokens must be filled in."""
        return self.policy.needs_prefix

    @property
    def needs_counts_only(self) -> bool:
        """True when each replica's running + waiting count is all it reads (least_queued
        takes those instead of whole snapshots)."""
        return self.policy.needs_counts_only

    def choose(self, prompt_len: int, loads: Sequence[ReplicaLoad] | int) -> int:
        """The replica for a request of prompt_len tokens; `loads` is one snapshot per
        replica, or just the replica count for round-robin."""
        return self.policy.choose(self, prompt_len, loads)

    def least_queued(self, queued: Sequence[int]) -> int:
        """least-requests from each replica's running + waiting count alone (a cluster
        passes these instead of whole snapshots): the fewest, ties in turn."""
        start = self.next_turn(len(queued))
        fewest = min(queued)
        try:  # the first fewest at or after `start`, else the first before it
            return queued.index(fewest, start)
        except ValueError:
            return queued.index(fewest)

    def next_turn(self, num: int) -> int:
        """Where this request's scan of num replicas starts (round-robin: its replica)."""
        if num < 1:
            raise ValueError("router: no replicas to choose from")
        start = self._turn % num
        self._turn = start + 1
        return start

    def scores(self, prompt_len: int, loads: Sequence[ReplicaLoad]) -> list[float]:
        """The prefix-aware router's score of each replica (higher is better)."""
        cfg = self.config
        queued = [load.num_requests for load in loads]
        low, high = min(queued), max(queued)
        spread = high - low
        return [
            cfg.prefix_weight * min(load.cached_tokens / prompt_len, 1.0)
            + cfg.queue_weight * ((high - q) / spread if spread else 1.0)
            + cfg.kv_weight * (1.0 - load.kv_usage)
            for load, q in zip(loads, queued, strict=True)
        ]


class RoundRobin:
    """Each replica in turn, whatever its load."""

    needs_loads = needs_kv = needs_prefix = needs_counts_only = False

    def choose(self, router: Router, prompt_len: int,  # noqa: ARG002 - the common signature
               loads: Sequence[ReplicaLoad] | int) -> int:
        return router.next_turn(loads if isinstance(loads, int) else len(loads))


class LeastRequests:
    """The fewest running + waiting requests (SGLang's and vLLM's production-stack default)."""

    needs_loads = needs_counts_only = True
    needs_kv = needs_prefix = False

    def choose(self, router: Router, prompt_len: int,  # noqa: ARG002 - the common signature
               loads: Sequence[ReplicaLoad] | int) -> int:
        if isinstance(loads, int):
            raise ValueError("router least-requests needs a load snapshot")
        return router.least_queued([load[0] + load[1] for load in loads])  # running + waiting


class LeastKv:
    """The least KV in use, then the fewest requests; ties in turn."""

    needs_loads = needs_kv = True
    needs_prefix = needs_counts_only = False

    def choose(self, router: Router, prompt_len: int,  # noqa: ARG002 - the common signature
               loads: Sequence[ReplicaLoad] | int) -> int:
        order = _turn_order(router, loads, "least-kv")
        return min(order, key=lambda i: (loads[i].kv_usage, loads[i].num_requests))


class PrefixAware:
    """The best of cache affinity, queue and free KV (RouterConfig's weights)."""

    needs_loads = needs_kv = needs_prefix = True
    needs_counts_only = False

    def choose(self, router: Router, prompt_len: int,
               loads: Sequence[ReplicaLoad] | int) -> int:
        order = _turn_order(router, loads, "prefix-aware")
        scores = router.scores(prompt_len, loads)
        return max(order, key=scores.__getitem__)


def _turn_order(router: Router, loads: Sequence[ReplicaLoad] | int, name: str) -> list[int]:
    """Replica indices from this request's turn on (the order ties are broken in)."""
    start = router.next_turn(loads if isinstance(loads, int) else len(loads))
    assert not isinstance(loads, int), f"router {name} needs a load snapshot"
    return [*range(start, len(loads)), *range(start)]


# --router name -> policy; a new router is a class above and a line here.
ROUTER_POLICIES: dict[str, type[RoundRobin | LeastRequests | LeastKv | PrefixAware]] = {
    "round-robin": RoundRobin,
    "least-requests": LeastRequests,
    "least-kv": LeastKv,
    "prefix-aware": PrefixAware,
}
ROUTERS = tuple(ROUTER_POLICIES)
