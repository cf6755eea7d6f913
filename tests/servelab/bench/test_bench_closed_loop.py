"""The load client's schedules: at most N in flight, closed-loop users, session turns that
wait for the previous answer and carry its real tokens."""

from __future__ import annotations

import asyncio

import pytest

from servelab.bench.client import BenchConfig, BenchRequest, bench_requests, run_bench
from tests.servelab.bench.bench_fakes import VOCAB_SIZE, HoldingServer, answer
from workloads import open_trace

SESSIONS = ("synthetic:users=4,turns=uniform(2,4),think=fixed(0.01),rate=50,"
            "question=fixed(12),output=fixed(5),system=9")


def lone_requests(count: int) -> list[BenchRequest]:
    """`count` requests all due at once, each with its own prompt."""
    return [BenchRequest(f"r{i}", 0.0, [3 + i, 4, 5], 3) for i in range(count)]


@pytest.mark.parametrize("limit", [1, 3])
def test_max_concurrency_keeps_at_most_n_requests_in_flight(limit):
    requests = lone_requests(10)
    with HoldingServer(hold_for=limit, expected=len(requests)) as server:
        result = asyncio.run(run_bench(requests, BenchConfig(server.url,
                                                             max_concurrency=limit)))
    assert result.errors == []
    assert server.max_in_flight == limit  # never more, and the limit is reached


def test_without_a_limit_every_due_request_is_in_flight_at_once():
    """The holding server would see fewer if the client held requests back: the test above
    can fail."""
    requests = lone_requests(6)
    with HoldingServer(hold_for=6, expected=6) as server:
        result = asyncio.run(run_bench(requests, BenchConfig(server.url)))
    assert result.errors == [] and server.max_in_flight == 6


def test_closed_loop_users_keep_exactly_that_many_in_flight():
    requests = lone_requests(9)
    with HoldingServer(hold_for=3, expected=len(requests)) as server:
        result = asyncio.run(run_bench(requests, BenchConfig(server.url), users=3))
    assert result.errors == [] and server.max_in_flight == 3
    assert all(len(r.output_token_ids) == 3 for r in result.requests)


def test_closed_loop_users_ignore_the_trace_clock():
    """Requests an hour apart in the trace follow each other at once under --users."""
    requests = [BenchRequest(f"r{i}", 3600.0 * i, [3 + i], 2) for i in range(3)]
    with HoldingServer(hold_for=1, expected=3) as server:
        result = asyncio.run(run_bench(requests, BenchConfig(server.url, timeout_s=60),
                                       users=1))
    assert result.errors == []


def run_sessions(spec: str, users: int | None = None):
    trace = open_trace(spec)
    requests = bench_requests(trace, VOCAB_SIZE)
    with HoldingServer(hold_for=1, expected=len(requests)) as server:
        result = asyncio.run(run_bench(requests, BenchConfig(server.url, timeout_s=60),
                                       users=users))
    assert result.errors == []
    return trace, result, server


def turns_by_session(trace, result) -> dict[str, list]:
    by_id = {r.request_id: r for r in result.requests}
    sessions: dict[str, list] = {}
    for rid, session, turn in zip(trace.request_ids, trace.table["session_id"],
                                  trace.table["turn"], strict=True):
        sessions.setdefault(session, []).append((turn, by_id[rid]))
    return {s: [r for _, r in sorted(turns, key=lambda t: t[0])]
            for s, turns in sessions.items()}


@pytest.mark.parametrize("users", [None, 2])
def test_a_turn_starts_only_after_the_previous_answer_ended(users):
    trace, result, server = run_sessions(SESSIONS, users)
    order = {(kind, prompt): i for i, (kind, prompt) in enumerate(server.events)}
    for turns in turns_by_session(trace, result).values():
        for before, after in zip(turns, turns[1:], strict=False):
            ended = order[("end", tuple(before.prompt_token_ids))]
            assert ended < order[("start", tuple(after.prompt_token_ids))]


def test_a_turn_carries_the_previous_prompt_and_the_answer_actually_generated():
    trace, result, _ = run_sessions(SESSIONS)
    question = 12
    for turns in turns_by_session(trace, result).values():
        assert len(turns[0].prompt_token_ids) == 9 + question
        for before, after in zip(turns, turns[1:], strict=False):
            generated = answer(tuple(before.prompt_token_ids), 5)
            assert before.output_token_ids == generated
            carried = before.prompt_token_ids + generated
            assert after.prompt_token_ids[:len(carried)] == carried
            assert len(after.prompt_token_ids) == len(carried) + question


def test_concurrency_stage_users_send_fresh_prompts_one_after_another():
    """stages=concurrency(U,N): U users whose requests do not continue a conversation."""
    trace, result, server = run_sessions("synthetic:stages=concurrency(3,9),prompt=fixed(10),"
                                         "output=fixed(4)")
    assert all(len(r.prompt_token_ids) == 10 for r in result.requests)
    assert server.max_in_flight <= 3
