"""`sweep` and `plan` run a session spec closed-loop, as `simulate` does: a turn is sent think
time after the previous answer ended (sim.cluster.closed_loop), unless open_loop asks for the
arrival times as written."""

from __future__ import annotations

import pytest

from servelab.sweeps.deployment_search import DeploymentProbe, Family, SearchContext, run_probe
from servelab.sweeps.grid import CapacitySlo, SweepContext, SweepPoint, run_point
from sim.cluster.config import ClusterConfig
from sim.cost.fixed_backend import ConstantBackend
from sim.policy_runs import simulate_policy
from workloads import open_trace
from workloads.trace import Trace

# One conversation of two turns; the second is written 5 s after the first.
CHAT = "synthetic:users=1,rate=1,turns=fixed(2),think=fixed(5),question=fixed(32),output=fixed(8)"
STEP_S = 0.01


def first_answer_longer(trace: Trace, extra: int) -> Trace:
    """The same conversation, its first answer `extra` tokens longer."""
    table = trace.table.copy()
    table.loc[table["turn"] == 0, "output_len"] += extra
    return Trace(trace.name, table)


def sweep_duration_s(trace: Trace, open_loop: bool) -> float:
    context = SweepContext(trace, ConstantBackend(step_s=STEP_S), num_blocks=256,
                           open_loop=open_loop)
    return run_point(context, SweepPoint("continuous", 1.0))["duration_s"]


@pytest.mark.parametrize("open_loop", [False, True])
def test_sweep_sends_the_next_turn_after_the_previous_answer(open_loop):
    chat = open_trace(CHAT)
    later = (sweep_duration_s(first_answer_longer(chat, 16), open_loop)
             - sweep_duration_s(chat, open_loop))
    # Closed loop: the first answer takes 16 more steps, so the second turn is sent, and
    # ends, 16 steps later. Open loop: the second turn goes at its written time either way.
    assert later == pytest.approx(0.0 if open_loop else 16 * STEP_S)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_capacity_probe_does_not_judge_a_turn_still_waiting_for_its_answer(replicas):
    # Each session's turns are all written at its start (no think time), but each is sent
    # only after the previous one's 30 steps: measured from the written times the later
    # turns would wait far past the 100 ms target, though every TTFT is one or two steps.
    spec = ("synthetic:users=20,rate=50,turns=fixed(4),think=fixed(0),question=fixed(32),"
            "output=fixed(30)")
    slo = CapacitySlo(ttft_p99_ms=100, itl_p99_ms=100)
    cluster = ClusterConfig(num_replicas=replicas) if replicas > 1 else None
    context = SweepContext(open_trace(spec), ConstantBackend(step_s=STEP_S), num_blocks=4096,
                           cluster=cluster)
    watched = run_point(context, SweepPoint("continuous", 1.0, verdict=slo))
    full = run_point(context, SweepPoint("continuous", 1.0))
    assert watched["stopped_s"] is None and slo.met(full)
    assert watched["p99_ttft_ms"] == full["p99_ttft_ms"] == pytest.approx(2 * STEP_S * 1e3)


def plan_row(trace: Trace, open_loop: bool) -> dict:
    context = SearchContext(trace, CapacitySlo(), enable_prefix_caching=False,
                          open_loop=open_loop)
    return run_probe(context, DeploymentProbe(Family("a100-80gb", policy="continuous"), 1))


@pytest.mark.parametrize("open_loop", [False, True])
def test_plan_sends_the_next_turn_after_the_previous_answer(open_loop):
    chat = open_trace(CHAT)
    short, long = plan_row(chat, open_loop), plan_row(first_answer_longer(chat, 16), open_loop)
    later = long["duration_s"] - short["duration_s"]
    # Without prefix caching the second turn costs the same either way: only when it is
    # sent differs, and closed-loop that follows the first answer's 16 more decode steps.
    if open_loop:
        assert later == pytest.approx(0.0, abs=1e-9)
    else:
        assert later > 16 * 1e-3  # a decode step of Llama-3-8B on an A100 is over 1 ms


def test_plan_prices_a_session_spec_as_simulate_runs_it():
    chat = open_trace(CHAT.replace("users=1", "users=6"))
    context = SearchContext(chat, CapacitySlo())
    point = DeploymentProbe(Family("a100-80gb", policy="continuous"), 1)
    row = run_probe(context, point)
    backend, config, _ = context.deployment(point)
    simulated = simulate_policy(chat, config, backend, None, False).summary
    for key in ("duration_s", "median_ttft_ms", "p99_e2el_ms", "prefix_cache_hit_rate"):
        assert row[key] == simulated[key]
