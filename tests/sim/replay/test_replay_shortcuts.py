"""The replay's shortcuts decide what the plain path decides: fast-forwarded steps applied together,
a cut run's engine woken without an interrupt, least-requests counts kept as queues change.

Each replay runs twice: with the shortcuts on, and with fast-forwarded steps applied one at a
time and cuts by interrupt, and must give identical token times, finishes, step records and
block ids (the order the pool would hand out its free blocks). Fast-forwarded steps applied
together call an on_step as one at a time would. Each test runs with the decode fast-forward
on and off (Engine.allow_fast_forward): off, the shortcuts have nothing to do, and the run
is the plain path's on both sides.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.cluster.config import ClusterConfig
from sim.cluster.router import Router, RouterConfig
from sim.cluster.run import _Cluster, run_cluster
from sim.cost.fixed_backend import ConstantBackend
from sim.cost.roofline import AnalyticCostModel
from sim.engine import fast_forward_run
from sim.engine.core import Request
from sim.engine.fast_forward_run import FastForwardRun
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace
from tests.sim.engine.test_fast_forward import outcome
from tests.sim.replay.test_fast_forward_run import STEP_S, grid_workload


def _replay(backend, config: SchedulerConfig, requests: list[Request],
            cluster: ClusterConfig | None, shortcuts: bool, fast_forward: bool,
            on_step=None) -> tuple:
    engines = [Engine(Scheduler(config), backend, allow_fast_forward=fast_forward)
               for _ in range(cluster.num_engines if cluster else 1)]
    with pytest.MonkeyPatch.context() as patch:
        if not shortcuts:  # every fast-forwarded step applied on its own, every cut an interrupt
            patch.setattr(fast_forward_run, "TOGETHER_MIN", 1 << 62)
            patch.setattr(_Cluster, "interrupts_cuts", True)
        if cluster:
            run_cluster(requests, engines, cluster, on_step=on_step)
        else:
            run_trace(requests, engines[0], on_step=on_step)
    pools = [e.scheduler.block_manager for e in engines]
    return outcome(requests, engines), [bm.take_blocks(bm.num_free_blocks) for bm in pools]


@pytest.fixture(params=[True, False], ids=["fast-forward", "listed"])
def fast_forward(request) -> bool:
    """Engine.allow_fast_forward of both replays a test compares."""
    return request.param


def ran(count: int, fast_forward: bool) -> bool:
    """A shortcut ran `count` times: more than 50 with the fast-forward on, none off."""
    return count > 50 if fast_forward else count == 0


@pytest.fixture
def calls(monkeypatch):
    """How often each shortcut ran."""
    counts = {"together": 0, "cuts": 0}
    together, cut = FastForwardRun._apply_together, _Cluster._cut

    def counting_together(self, *args):
        counts["together"] += 1
        return together(self, *args)

    def counting_cut(self, index, end_s):
        counts["cuts"] += not self.interrupts_cuts
        cut(self, index, end_s)

    monkeypatch.setattr(FastForwardRun, "_apply_together", counting_together)
    monkeypatch.setattr(_Cluster, "_cut", counting_cut)
    return counts


@pytest.mark.parametrize("config", [
    SchedulerConfig(policy="chunked", token_budget=64, max_num_seqs=8, num_blocks=400),
    SchedulerConfig(policy="chunked", num_blocks=120, enable_prefix_caching=True),  # evicts
    SchedulerConfig(policy="continuous", num_blocks=400, queue="priority"),
], ids=["chunked", "caching, small pool", "continuous, priority"])
def test_steps_applied_together_take_the_blocks_one_at_a_time_would(config, calls,
                                                                     fast_forward):
    backend = ConstantBackend(step_s=STEP_S)

    def requests() -> list[Request]:
        return [Request(r.request_id, r.arrival_s, r.prompt_len, r.max_new_tokens,
                        priority=r.priority, prefix_hash_ids=(i % 3, 100 + i))
                for i, r in enumerate(grid_workload(300, 3, 16))]

    together = _replay(backend, config, requests(), None, True, fast_forward)
    assert ran(calls["together"], fast_forward)
    assert together == _replay(backend, config, requests(), None, False, fast_forward)


@pytest.mark.parametrize("cluster", [None, ClusterConfig(num_replicas=3,
                                                          router=RouterConfig("least-requests"))],
                         ids=["one engine", "cluster"])
def test_steps_applied_together_call_on_step_as_one_at_a_time_would(cluster, calls,
                                                                    fast_forward):
    """A step hook (an SLO watch, a progress bar, a closed loop) sees every step's end and
    the requests it finished, in the same order, whichever way fast-forwarded steps are
    applied."""
    backend = ConstantBackend(step_s=STEP_S)
    config = SchedulerConfig(policy="chunked", token_budget=128, max_num_seqs=16,
                             num_blocks=120)
    seen: dict[bool, list] = {True: [], False: []}
    outcomes = {}
    for together in (True, False):
        def hook(now: float, finished: list[Request], log=seen[together]) -> None:
            log.append((now, [r.request_id for r in finished]))
        outcomes[together] = _replay(backend, config, grid_workload(300, 4, 16), cluster,
                                     together, fast_forward, on_step=hook)
    assert ran(calls["together"], fast_forward)
    assert outcomes[True] == outcomes[False]
    assert seen[True] == seen[False]
    assert sum(len(f) for _, f in seen[True]) == 300


@pytest.mark.parametrize("router", ["round-robin", "least-requests", "least-kv"])
@pytest.mark.parametrize("pd", [False, True], ids=["co-located", "P/D"])
def test_a_cut_run_wakes_its_engine_when_an_interrupt_would(router, pd, calls, fast_forward):
    """Arrivals cut co-located engines' runs; under P/D, KV hand-offs (here instant: on the
    step grid) cut decode engines' runs."""
    backend = ConstantBackend(step_s=STEP_S)
    config = SchedulerConfig(policy="chunked", token_budget=128, max_num_seqs=16,
                             num_blocks=40)  # preempts
    cluster = (ClusterConfig(router=RouterConfig(router), num_prefill=1, num_decode=3)
               if pd else ClusterConfig(num_replicas=3, router=RouterConfig(router)))
    moved = _replay(backend, config, grid_workload(400, 2, 6), cluster, True, fast_forward)
    assert ran(calls["cuts"], fast_forward)
    assert moved == _replay(backend, config, grid_workload(400, 2, 6), cluster, False,
                            fast_forward)


@pytest.mark.parametrize("cluster", [
    ClusterConfig(num_replicas=4, router=RouterConfig("least-requests")),
    ClusterConfig(router=RouterConfig("least-requests"), num_prefill=1, num_decode=3,
                  kv_link_gbps=10.0, kv_bytes_per_token=131072),
], ids=["co-located", "P/D"])
def test_least_requests_reads_the_counts_a_recount_gives(cluster, monkeypatch, fast_forward):
    """At every arrival, the counts the router reads equal each engine's running + waiting."""
    backend = AnalyticCostModel.preset("llama-3-8b", "h100")
    config = SchedulerConfig(policy="chunked", num_blocks=150)  # preempts
    engines = [Engine(Scheduler(config), backend, allow_fast_forward=fast_forward)
               for _ in range(cluster.num_engines)]
    schedulers = [e.scheduler for e in engines]
    least_queued, seen = Router.least_queued, []

    def checked(self, queued):
        pool = (schedulers if len(queued) == len(schedulers) else
                schedulers[:cluster.num_prefill] if self is routers[0] else
                schedulers[cluster.num_prefill:])
        assert list(queued) == [len(s.running) + len(s.waiting) for s in pool]
        seen.append(sum(queued))
        return least_queued(self, queued)

    routers: list[Router] = []
    init = _Cluster.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        routers.extend([self.router, self.decode_router])

    monkeypatch.setattr(_Cluster, "__init__", recording_init)
    monkeypatch.setattr(Router, "least_queued", checked)
    rng = np.random.default_rng(4)
    arrivals = np.cumsum(rng.exponential(1 / 40, 300))
    requests = [Request(f"r{i}", float(t), int(rng.integers(20, 900)),
                        int(rng.integers(1, 150))) for i, t in enumerate(arrivals)]
    run_cluster(requests, engines, cluster)
    assert len(seen) >= 300 and max(seen) > 2 * len(engines)  # queues built up
    assert sum(s.num_preemptions for s in schedulers) > 0
