"""The router: each configuration's choice on hand-made snapshots."""

from __future__ import annotations

import pytest

from sim.cluster.router import ReplicaLoad, Router, RouterConfig


def _load(running: int = 0, waiting: int = 0, kv: float = 0.0, cached: int = 0) -> ReplicaLoad:
    return ReplicaLoad(running, waiting, kv, cached)


def test_round_robin_cycles_through_replicas():
    router = Router("round-robin")
    assert [router.choose(10, 3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_requests_counts_running_and_waiting():
    router = Router("least-requests")
    loads = [_load(2, 3), _load(4, 0), _load(1, 5)]
    assert router.choose(10, loads) == 1


def test_ties_rotate_so_an_idle_cluster_spreads_requests():
    router = Router("least-requests")
    idle = [_load(), _load(), _load()]
    assert [router.choose(10, idle) for _ in range(3)] == [0, 1, 2]


def test_least_kv_prefers_free_memory_then_fewer_requests():
    router = Router("least-kv")
    assert router.choose(10, [_load(1, 0, 0.5), _load(9, 0, 0.2), _load(0, 0, 0.9)]) == 1
    assert router.choose(10, [_load(3, 0, 0.2), _load(1, 0, 0.2)]) == 1


def test_prefix_aware_follows_the_cache_while_loads_are_close():
    router = Router("prefix-aware")
    loads = [_load(3, 0, 0.3), _load(4, 0, 0.3, cached=900), _load(3, 0, 0.3)]
    assert router.choose(1000, loads) == 1


def test_prefix_aware_leaves_a_hot_replica_for_a_partial_hit():
    router = Router("prefix-aware")
    loads = [_load(0, 0, 0.1), _load(30, 20, 0.9, cached=300)]
    assert router.choose(1000, loads) == 0


def test_prefix_aware_without_cache_is_least_loaded():
    router = Router("prefix-aware")
    assert router.choose(100, [_load(5, 1, 0.4), _load(2, 0, 0.4), _load(7, 0, 0.4)]) == 1


def test_router_rejects_unknown_names_and_negative_weights():
    with pytest.raises(ValueError, match="unknown router 'random'"):
        RouterConfig("random")
    with pytest.raises(ValueError, match="queue_weight"):
        RouterConfig("prefix-aware", queue_weight=-1)
    with pytest.raises(ValueError, match="no replicas"):
        Router("least-kv").choose(10, [])
