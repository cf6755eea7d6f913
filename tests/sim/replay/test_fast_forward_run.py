"""Fast-forward runs (sim.engine.fast_forward_run): decode-only steps priced in one go and applied
as time passes them decide exactly what stepping one SimPy event at a time decides, also when
requests arrive at the very instant a step ends, on one engine and in a cluster whose arrivals
cut runs short."""

from __future__ import annotations

import numpy as np
import pytest

from sim.cluster.config import ClusterConfig
from sim.cluster.router import RouterConfig
from sim.cost.fixed_backend import ConstantBackend
from sim.cost.roofline import AnalyticCostModel
from sim.engine import fast_forward_run
from sim.engine.core import Request
from sim.engine.scheduler_config import SchedulerConfig
from tests.sim.engine.test_fast_forward import replay

STEP_S = 1 / 64  # exact in binary: step ends and arrivals on one grid meet exactly


def grid_workload(n: int, seed: int, max_gap: int) -> list[Request]:
    """Arrivals on the STEP_S grid, 0 to max_gap - 1 steps apart; short prompts and outputs."""
    rng = np.random.default_rng(seed)
    ticks = np.cumsum(rng.integers(0, max_gap, n))
    return [Request(f"r{i}", float(t) * STEP_S, int(rng.integers(8, 200)),
                    int(rng.integers(1, 60)), priority=int(rng.integers(3)))
            for i, t in enumerate(ticks)]


@pytest.fixture
def counted(monkeypatch):
    """How many fast-forward runs started and how many an arrival cut."""
    counts = {"runs": 0, "cuts": 0}
    run_class = fast_forward_run.FastForwardRun
    start, cut = run_class.start.__func__, run_class.cut

    def counting_start(cls, *args, **kwargs):
        run = start(cls, *args, **kwargs)
        counts["runs"] += run is not None
        return run

    def counting_cut(self, now):
        counts["cuts"] += 1
        cut(self, now)

    monkeypatch.setattr(run_class, "start", classmethod(counting_start))
    monkeypatch.setattr(run_class, "cut", counting_cut)
    return counts


def ties(requests: list[Request], steps) -> int:
    """Arrivals at the exact end of some step."""
    ends = {s.start_s + s.duration_s for engine_steps in steps for s in engine_steps}
    return sum(r.arrival_s in ends for r in requests)


@pytest.mark.parametrize("config", [
    SchedulerConfig(policy="chunked", token_budget=64, max_num_seqs=8, num_blocks=400),
    SchedulerConfig(policy="continuous", num_blocks=60, queue="priority"),
], ids=["chunked", "priority, small pool"])
def test_one_engine_with_arrivals_on_step_ends(config, counted):
    backend = ConstantBackend(step_s=STEP_S)
    fast = replay(backend, config, grid_workload(300, 1, 12), None, True)
    assert counted["runs"] > 100
    listed = replay(backend, config, grid_workload(300, 1, 12), None, False)
    assert fast == listed
    assert ties(grid_workload(300, 1, 12), listed[1]) > 100


@pytest.mark.parametrize("router", ["round-robin", "least-requests", "least-kv"])
def test_a_cluster_with_arrivals_on_step_ends(router, counted):
    backend = ConstantBackend(step_s=STEP_S)
    config = SchedulerConfig(policy="chunked", token_budget=128, max_num_seqs=16,
                             num_blocks=40)  # preempts
    cluster = ClusterConfig(num_replicas=3, router=RouterConfig(router))
    fast = replay(backend, config, grid_workload(400, 2, 6), cluster, True)
    assert counted["runs"] > 100 and counted["cuts"] > 50
    listed = replay(backend, config, grid_workload(400, 2, 6), cluster, False)
    assert fast == listed
    assert ties(grid_workload(400, 2, 6), listed[1]) > 100
    assert sum(s.num_preempted for steps in listed[1] for s in steps) > 0


def test_a_cluster_of_cost_models_cuts_runs_and_decides_the_same(counted):
    backend = AnalyticCostModel.preset("llama-3-8b", "h100")
    config = SchedulerConfig(policy="chunked", num_blocks=400, enable_prefix_caching=True)
    cluster = ClusterConfig(num_replicas=4, router=RouterConfig("prefix-aware"))
    rng = np.random.default_rng(5)
    arrivals = np.cumsum(rng.exponential(1 / 80, 600))
    requests = [Request(f"r{i}", float(t), int(rng.integers(20, 900)), int(rng.integers(1, 150)),
                        prefix_hash_ids=(int(rng.integers(3)), 100 + i))
                for i, t in enumerate(arrivals)]

    def fresh() -> list[Request]:
        return [Request(r.request_id, r.arrival_s, r.prompt_len, r.max_new_tokens,
                        prefix_hash_ids=r.prefix_hash_ids) for r in requests]

    fast = replay(backend, config, fresh(), cluster, True)
    assert counted["runs"] > 100 and counted["cuts"] > 50
    assert fast == replay(backend, config, fresh(), cluster, False)


@pytest.mark.parametrize("router", ["round-robin", "least-requests", "least-kv"])
@pytest.mark.parametrize("link", [0, 4096], ids=["instant transfers", "transfers"])
def test_a_pd_cluster_whose_hand_offs_cut_decode_runs_decides_the_same(router, link, counted):
    """A decode engine's requests come from KV transfers, not the arrival process: a transfer
    that ends as a decode step ends (instant ones end on the step grid) is seen by the step
    after it, with fast-forward runs as without."""
    backend = ConstantBackend(step_s=STEP_S)
    config = SchedulerConfig(policy="chunked", token_budget=128, max_num_seqs=16,
                             num_blocks=60)  # preempts
    # 4096 bytes a token over 0.4 Gb/s: a prompt's transfer takes 0.08 ms a token.
    cluster = ClusterConfig(router=RouterConfig(router), num_prefill=2, num_decode=3,
                            kv_link_gbps=0.4, kv_bytes_per_token=link)
    fast = replay(backend, config, grid_workload(400, 3, 6), cluster, True)
    assert counted["runs"] > 100 and counted["cuts"] > 50
    listed = replay(backend, config, grid_workload(400, 3, 6), cluster, False)
    assert fast == listed
    if not link:  # hand-offs at the end of a prefill step, on the grid of decode steps
        prefill_ends = {s.start_s + s.duration_s for steps in listed[1][:2] for s in steps}
        decode_ends = {s.start_s + s.duration_s for steps in listed[1][2:] for s in steps}
        assert len(prefill_ends & decode_ends) > 50
    assert sum(s.num_preempted for steps in listed[1] for s in steps) > 0


def test_a_pd_cluster_with_prefix_caching_and_priorities_decides_the_same(counted):
    """Decode engines register the blocks their rows fill (a run ends there) and admit by
    priority; prefix-aware routing reads their caches at each hand-off."""
    backend = AnalyticCostModel.preset("llama-3-8b", "h100")
    config = SchedulerConfig(policy="chunked", num_blocks=200, enable_prefix_caching=True,
                             queue="priority")
    cluster = ClusterConfig(router=RouterConfig("prefix-aware"), num_prefill=2, num_decode=3,
                            kv_bytes_per_token=131072)

    def requests() -> list[Request]:
        return [Request(r.request_id, r.arrival_s, r.prompt_len, r.max_new_tokens,
                        priority=r.priority, prefix_hash_ids=(i % 3, 100 + i))
                for i, r in enumerate(grid_workload(400, 4, 4))]

    fast = replay(backend, config, requests(), cluster, True)
    assert counted["runs"] > 100 and counted["cuts"] > 50
    listed = replay(backend, config, requests(), cluster, False)
    assert fast == listed
    assert sum(hits for _, hits in listed[2][2:]) > 0  # decode engines hit their caches
