"""Clusters in one SimPy environment: replicas behind routers, and P/D disaggregation."""

from __future__ import annotations

import numpy as np
import pytest

from sim.cluster.config import ClusterConfig
from sim.cluster.router import RouterConfig
from sim.cluster.run import run_cluster
from sim.cluster.tables import replica_table
from sim.cost.fixed_backend import ConstantBackend
from sim.engine.core import Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.metrics import summarize
from sim.replay.simulation import StalledError, run_trace

BACKEND = ConstantBackend(step_s=0.01, per_token_s=1e-4)


def poisson_requests(n: int, rate: float, seed: int = 0, prefixes: int = 0) -> list[Request]:
    """n requests at `rate`/s; with `prefixes`, each shares one of that many 2-block stems."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    out = []
    for i, t in enumerate(arrivals):
        prompt = int(rng.integers(600, 1100))
        hashes = (int(rng.integers(prefixes)) * 10, int(rng.integers(prefixes)) * 10 + 1,
                  1000 + i) if prefixes else None
        out.append(Request(f"r{i}", float(t), prompt, int(rng.integers(5, 40)),
                           prefix_hash_ids=hashes))
    return out


def engines(n: int, **config) -> list[Engine]:
    cfg = SchedulerConfig(**{"policy": "chunked", "num_blocks": 2000, **config})
    return [Engine(Scheduler(cfg), BACKEND) for _ in range(n)]


def cluster(n: int, router: str = "round-robin", **kw) -> ClusterConfig:
    return ClusterConfig(num_replicas=n, router=RouterConfig(router), **kw)


def test_one_replica_cluster_matches_the_single_engine_loop():
    alone, clustered = poisson_requests(200, 20), poisson_requests(200, 20)
    run_trace(alone, engines(1)[0])
    run_cluster(clustered, engines(1), cluster(1))
    assert [r.token_times_s for r in clustered] == [r.token_times_s for r in alone]


def test_round_robin_deals_requests_evenly_and_every_request_completes():
    requests = poisson_requests(100, 50)
    result = run_cluster(requests, engines(4), cluster(4))
    assert [len(s) for s in result.served] == [25, 25, 25, 25]
    assert all(len(r.token_times_s) == r.max_new_tokens for r in requests)
    table = replica_table(result)
    assert table["requests"].tolist() == [25] * 4 and (table["busy_frac"] > 0).all()


@pytest.mark.parametrize("router", ["least-requests", "least-kv", "prefix-aware"])
def test_more_replicas_cut_the_tail_under_overload(router):
    one = summarize(run_cluster(poisson_requests(300, 60), engines(1), cluster(1)).run_result())
    four = summarize(run_cluster(poisson_requests(300, 60), engines(4),
                                 cluster(4, router)).run_result())
    assert four["completed"] == one["completed"] == 300
    assert four["p99_ttft_ms"] < one["p99_ttft_ms"] / 2


def test_prefix_aware_keeps_shared_stems_together():
    # 20 stems of 64 blocks and pools of 600: one replica cannot cache them all, four
    # replicas each holding its own share can.
    def run(router: str) -> dict:
        requests = poisson_requests(400, 8, prefixes=20)
        return summarize(run_cluster(requests, engines(4, num_blocks=600),
                                     cluster(4, router)).run_result())

    aware, spread = run("prefix-aware"), run("round-robin")
    assert aware["prefix_cache_hit_rate"] > spread["prefix_cache_hit_rate"] + 0.1
    assert aware["median_ttft_ms"] < spread["median_ttft_ms"]


def pd_ttft_ms(link_gbps: float, prompt: int = 4000) -> tuple[float, float]:
    request = Request("a", 0.0, prompt, 5)
    config = cluster(1, num_prefill=1, num_decode=1, kv_link_gbps=link_gbps,
                     kv_bytes_per_token=131072)
    result = run_cluster([request], engines(2, max_model_len=8192), config)
    assert len(request.token_times_s) == 5 and result.served[1] == [request]
    return (request.token_times_s[0] - request.arrival_s) * 1e3, config.transfer_s(prompt) * 1e3


def test_pd_ttft_includes_the_kv_transfer():
    fast_ms, fast_transfer_ms = pd_ttft_ms(400.0)
    slow_ms, slow_transfer_ms = pd_ttft_ms(1.0)
    assert slow_transfer_ms == pytest.approx(4000 * 131072 * 8 / 1e9 * 1e3)
    assert slow_ms - fast_ms == pytest.approx(slow_transfer_ms - fast_transfer_ms)


def test_pd_prefill_engine_keeps_a_prompts_kv_until_it_is_sent():
    # The prefill pool holds one 4000-token prompt (250 of 300 blocks), and the link takes
    # 4.2 s to send it: the second prompt starts only when the first one's KV has left.
    first, second = Request("a", 0.0, 4000, 2), Request("b", 0.0, 4000, 2)
    config = cluster(1, num_prefill=1, num_decode=1, kv_link_gbps=1.0,
                     kv_bytes_per_token=131072)
    result = run_cluster([first, second], engines(2, policy="continuous", num_blocks=300,
                                                  max_model_len=8192), config)
    prefill = result.engines[0]
    prefilled_s = prefill.steps[0].start_s + prefill.steps[0].duration_s
    assert prefill.steps[0].kv_blocks_used >= 250  # kept after the stand-in finished
    assert second.first_scheduled_s == pytest.approx(prefilled_s + config.transfer_s(4000))
    assert prefill.scheduler.block_manager.num_used_blocks == 0  # both sent, both freed
    assert len(first.token_times_s) == len(second.token_times_s) == 2


def test_pd_decode_engine_computes_only_the_last_prompt_token():
    request = Request("a", 0.0, 1000, 3)
    config = cluster(1, num_prefill=1, num_decode=1, kv_bytes_per_token=1024)
    result = run_cluster([request], engines(2), config)
    prefill, decode = (engine.steps for engine in result.engines)
    assert sum(s.prefill_tokens for s in prefill) == 1000
    assert decode[0].num_tokens == 1 and len(decode) == 3


def test_pd_completes_a_busy_trace_and_rejects_what_never_fits():
    requests = poisson_requests(150, 30) + [Request("huge", 100.0, 9000, 5)]
    config = cluster(1, num_prefill=1, num_decode=2, kv_bytes_per_token=131072)
    summary = summarize(run_cluster(requests, engines(3), config).run_result())
    assert summary["completed"] == 150 and summary["rejected"] == 1


def test_cluster_config_rejects_half_a_pd_split_and_a_dead_link():
    with pytest.raises(ValueError, match="P/D needs"):
        ClusterConfig(num_prefill=1)
    with pytest.raises(ValueError, match="kv link"):
        ClusterConfig(num_prefill=1, num_decode=1, kv_link_gbps=0)
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        ClusterConfig(num_replicas=0)


def test_an_engine_that_cannot_admit_is_reported_as_stalled():
    request = Request("a", 0.0, 100, 5)
    stuck = engines(1, num_blocks=100)
    stuck[0].scheduler.block_manager.try_allocate("squatter", 100 * 16)
    with pytest.raises(StalledError, match="1 requests never finished"):
        run_cluster([request], stuck, cluster(1))
