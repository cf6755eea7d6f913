"""Closed-loop arrivals (sim.cluster.closed_loop): a session's turn waits for the previous answer
plus
its think time, N users keep N requests in flight, and the simulated prefix cache finds a
previous turn's prompt and answer, on one engine and in a cluster."""

from __future__ import annotations

import math

import pytest

from sim.cluster.closed_loop import closed_loop, run_closed_cluster, run_closed_trace
from sim.cluster.config import ClusterConfig
from sim.cluster.router import RouterConfig
from sim.cost.fixed_backend import ConstantBackend
from sim.cost.roofline import AnalyticCostModel
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.policy_runs import run_deployment
from sim.replay.verdict import SloWatch
from sim.replay.workload import requests_from_trace
from workloads import open_trace

SESSIONS = ("synthetic:users=12,rate=4,turns=uniform(2,5),think=lognormal(0.5,0.5),"
            "question=uniform(20,200),output=uniform(5,60)")
CHAT = "synthetic:users=4,rate=1,turns=fixed(3),think=fixed(1),question=fixed(40),output=fixed(24)"


def simulate(spec: str, replicas: int | str = 1, users: int | None = None,
             fast_forward: bool = True,
             backend=None, router: str = "round-robin", num_blocks: int = 4096):
    """replicas: an engine count, or "P:D" for prefill/decode disaggregation."""
    trace = open_trace(spec, seed=3)
    requests = requests_from_trace(trace)
    loop = closed_loop(trace, requests, users)
    assert loop is not None
    config = SchedulerConfig("chunked", num_blocks=num_blocks)
    backend = backend or ConstantBackend(step_s=0.01, per_token_s=1e-5)
    if isinstance(replicas, str):
        prefill, decode = map(int, replicas.split(":"))
        cluster = ClusterConfig(router=RouterConfig(router), num_prefill=prefill,
                                num_decode=decode, kv_bytes_per_token=131072)
    else:
        cluster = ClusterConfig(num_replicas=replicas, router=RouterConfig(router))
    engines = [Engine(Scheduler(config), backend, allow_fast_forward=fast_forward)
               for _ in range(cluster.num_engines)]
    if cluster.num_engines == 1:
        run_closed_trace(requests, engines[0], loop)
    else:
        run_closed_cluster(requests, engines, cluster, loop)
    return trace, requests


def turns_by_session(trace, requests):
    table = trace.table
    sessions: dict[str, list] = {}
    for session, turn, think_s, request in zip(table["session_id"], table["turn"],
                                               table["think_s"], requests, strict=True):
        sessions.setdefault(session, []).append((int(turn), float(think_s), request))
    return [sorted(rows, key=lambda r: r[0]) for rows in sessions.values()]


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_turn_is_sent_think_time_after_the_previous_answer(replicas):
    trace, requests = simulate(SESSIONS, replicas)
    written = dict(zip(trace.request_ids, trace.arrival_s.tolist(), strict=True))
    for rows in turns_by_session(trace, requests):
        assert rows[0][2].arrival_s == written[rows[0][2].request_id]  # the first as written
        for (_, _, before), (_, think_s, after) in zip(rows, rows[1:], strict=False):
            assert before.is_finished and before.finish_s is not None
            assert after.arrival_s == before.finish_s + think_s
            assert after.token_times_s[0] > before.finish_s
    # Answers take time, so the loop sends later turns later than the trace wrote them.
    assert any(r.arrival_s > written[r.request_id] for r in requests)


@pytest.mark.parametrize("replicas", [1, 2, "1:2"])
def test_fast_forwarded_rows_release_turns_as_listed_rows_do(replicas):
    """Fast-forward runs finish rows in bulk: the loop still sees each finish at its own time."""
    model = AnalyticCostModel.preset("llama-3-8b", "h100")
    _, fast = simulate(SESSIONS, replicas, backend=model)
    _, listed = simulate(SESSIONS, replicas, backend=model, fast_forward=False)
    for a, b in zip(fast, listed, strict=True):
        assert (a.arrival_s, a.finish_s, a.token_times_s, a.num_cached_tokens) == (
            b.arrival_s, b.finish_s, b.token_times_s, b.num_cached_tokens)


@pytest.mark.parametrize("replicas", [1, 2])
def test_users_keep_that_many_requests_in_flight(replicas):
    spec = "synthetic:n=60,rate=100,prompt=uniform(20,300),output=uniform(1,80)"
    _, requests = simulate(spec, replicas, users=5)
    events = sorted([(r.arrival_s, 1) for r in requests] + [(r.finish_s, -1) for r in requests],
                    key=lambda e: (e[0], e[1]))
    in_flight, peak = 0, 0
    for _, change in events:
        in_flight += change
        peak = max(peak, in_flight)
    assert peak == 5
    assert sorted(r.arrival_s for r in requests)[:5] == [0.0] * 5
    # Every later request starts the instant one of the earlier ones finished.
    finishes = {r.finish_s for r in requests}
    assert all(r.arrival_s in finishes for r in requests if r.arrival_s > 0)


def test_concurrency_stage_is_a_closed_loop_of_its_users():
    spec = "synthetic:stages=concurrency(4,40),prompt=fixed(100),output=fixed(20)"
    _, requests = simulate(spec)
    starts = sorted(r.arrival_s for r in requests)
    assert starts[:4] == [0.0] * 4 and starts[4] > 0
    finishes = {r.finish_s for r in requests}
    assert all(r.arrival_s in finishes for r in requests if r.arrival_s > 0)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_turn_hits_the_previous_turns_prompt_and_answer(replicas):
    """Turn k-1 computed its prompt and all but its last output token: every full block of
    those is cached, as a live server caches the answer it generated."""
    trace, requests = simulate(CHAT, replicas, router="prefix-aware")
    block = 16
    for rows in turns_by_session(trace, requests):
        for (_, _, before), (_, _, after) in zip(rows, rows[1:], strict=False):
            computed = before.prompt_len + before.max_new_tokens - 1
            assert after.prompt_len == before.prompt_len + before.max_new_tokens + 40
            assert after.num_cached_tokens == computed // block * block


def test_open_loop_and_plain_traces_have_no_loop():
    trace = open_trace(CHAT, seed=0)
    requests = requests_from_trace(trace)
    assert closed_loop(trace, requests, open_loop=True) is None
    plain = open_trace("synthetic:n=5,rate=1", seed=0)
    assert closed_loop(plain, requests_from_trace(plain)) is None
    with pytest.raises(ValueError, match="--open-loop"):
        closed_loop(trace, requests, users=2, open_loop=True)
    with pytest.raises(ValueError, match="users must be >= 1"):
        closed_loop(plain, requests_from_trace(plain), users=0)


def test_a_truncated_conversation_does_not_name_the_answer_it_dropped():
    from workloads.sessions import answer_segments

    spec = ("synthetic:users=1,rate=1,turns=fixed(4),think=fixed(1),question=fixed(100),"
            "output=fixed(50),max_len=400")
    trace = open_trace(spec, seed=0)
    answers = answer_segments(trace)
    ids = trace.table["prefix_hash_ids"].tolist()
    # Turn 1 (250 tokens) carries turn 0 whole; turn 2 drops turn 0 to fit, so it does not
    # start like turn 1: turn 1's answer stays its own, as does the last turn's.
    assert answers[0] == (int(ids[1][1]), 50)
    assert answers[1:] == [None, None, None]
    requests = requests_from_trace(trace)
    assert requests[0].prefix_hash_tokens == (100, 50)
    assert requests[1].prefix_hash_tokens == tuple(trace.prefix_tokens()[1])


def test_a_run_stopped_early_gives_the_turns_it_never_sent_their_written_times_back():
    trace = open_trace(CHAT, seed=3)
    requests = requests_from_trace(trace)
    written = dict(zip(trace.request_ids, trace.arrival_s.tolist(), strict=True))
    config = SchedulerConfig("chunked", num_blocks=4096)
    # Targets no step meets: the watch stops the run at the first finished request.
    watch = SloWatch(requests, 1e-3, 1e-3, config.never_fits)
    result, _ = run_deployment(requests, config, ConstantBackend(step_s=0.01), None, watch,
                               closed_loop(trace, requests))
    assert result.stopped_s is not None
    assert all(math.isfinite(r.arrival_s) for r in requests)
    never_sent = [r for r in requests if r.first_scheduled_s is None
                  and r.arrival_s == written[r.request_id]]
    assert any(r.request_id.endswith("-t2") for r in never_sent)
