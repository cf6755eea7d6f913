"""`servelab route` tries a request again while its client has received nothing: after a
per-try deadline (on a clock the test moves), a 5xx or garbage answer, or the ejection of the
upstream it waits on; never once a stream has sent an event. The hung fakes here never answer
until the test says so, the healthy one answers at once: nothing decides by machine speed."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from servelab.route.app import RouterThread
from servelab.route.health import HealthConfig
from servelab.route.retry import RetryBudget, RetryConfig
from servelab.route.state import RouteConfig
from servelab.route.upstreams import Upstream, parse_reading
from sim.cluster.router import RouterConfig
from tests.servelab.route.route_fakes import (
    DyingUpstream,
    FakeClock,
    FakeUpstream,
    ResettingUpstream,
)
from tests.servelab.route.test_route import post, router_metric
from tests.servelab.serve.helpers import HANG_S, wait_until

PER_TRY_S = 5.0  # on the fake clock


def retry_router(urls: list[str], clock: FakeClock, checks: bool = False,
                 **retry: object) -> RouterThread:
    """Round-robin (a, then b) with a fixed per-try deadline on the fake clock; health checks
    every 0.05 s if `checks`; an ejection lasts until the test moves the clock far."""
    health = HealthConfig(check_interval_s=0.05 if checks else 0.0, check_timeout_s=1.0,
                          eject_after_failures=3, ejection_base_s=1000.0, ejection_max_s=4000.0)
    config = RouteConfig(tuple(urls), RouterConfig("round-robin"), 0.05, health=health,
                         retry=RetryConfig(**{"per_try_timeout_s": PER_TRY_S, **retry}))
    return RouterThread(config, clock=clock, clock_step_s=0.01)


def in_flight(r: RouterThread, index: int) -> int:
    return r.state.upstreams[index].in_flight


def stream_lines(url: str, body: dict) -> tuple[int, list[str]]:
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True},
                      trust_env=False, timeout=HANG_S) as response:
        return response.status_code, [line for line in response.iter_lines() if line]


@pytest.fixture
def pool():
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        yield executor


def second_request_waits_at_b(r: RouterThread, pool, send) -> concurrent.futures.Future:
    """Round-robin: the first request goes to a (answered), the second to b, where it waits."""
    send()
    future = pool.submit(send)
    wait_until(lambda: in_flight(r, 1) == 1, "the second request reached b")
    return future


def test_a_non_streamed_request_past_its_per_try_deadline_goes_elsewhere(pool):
    clock = FakeClock()
    with FakeUpstream("a") as a, FakeUpstream("b") as b, retry_router([a.url, b.url], clock) as r:
        b.gate.clear()  # b's completions hang; its /health answers
        answer = second_request_waits_at_b(r, pool, lambda: post(r.url, {"prompt": "hi"}))
        clock.advance(PER_TRY_S - 0.5)
        time.sleep(0.1)  # the deadline is not yet reached: the try waits on
        assert not answer.done() and in_flight(r, 1) == 1
        clock.advance(0.5)
        response = answer.result(HANG_S)
        wait_until(lambda: b.aborted == 1, "b saw the abandoned request go")
        retried = router_metric(r.url, "servelab_router_retries_total", upstream=b.url,
                                reason="timeout")
        timeouts = router_metric(r.url, "servelab_router_upstream_errors_total",
                                 upstream=b.url, kind="per_try_timeout")
    assert response.status_code == 200 and response.json()["model"] == "a"
    assert (retried, timeouts, len(a.bodies), len(b.bodies)) == (1, 1, 2, 1)


def test_a_stream_without_its_first_event_by_the_deadline_goes_elsewhere(pool):
    """b sends the stream's headers, then waits before its only event: the client has seen
    nothing, so the request is a's, and the client sees a's stream alone."""
    clock = FakeClock()
    body = {"prompt": "hi", "max_tokens": 1}
    with FakeUpstream("a") as a, FakeUpstream("b") as b, retry_router([a.url, b.url], clock) as r:
        b.gate.clear()
        answer = second_request_waits_at_b(r, pool, lambda: stream_lines(r.url, body))
        clock.advance(PER_TRY_S)
        status, lines = answer.result(HANG_S)
        wait_until(lambda: b.aborted == 1, "b saw the abandoned stream go")
        timeouts = router_metric(r.url, "servelab_router_upstream_errors_total",
                                 upstream=b.url, kind="first_byte_timeout")
    assert status == 200 and timeouts == 1
    assert lines == ['data: {"model": "a", "chunk": 0}', "data: [DONE]"]


def test_an_upstream_ejected_by_its_checks_hands_its_waiting_requests_on(pool):
    """No deadline passes (the clock stays): the ejection alone sends the request on."""
    clock = FakeClock()
    with FakeUpstream("a") as a, FakeUpstream("b") as b, \
            retry_router([a.url, b.url], clock, checks=True) as r:
        b.gate.clear()
        answer = second_request_waits_at_b(r, pool, lambda: post(r.url, {"prompt": "hi"}))
        b.healthy = False  # three failed checks eject b
        response = answer.result(HANG_S)
        wait_until(lambda: b.aborted == 1, "b saw the abandoned request go")
        retried = router_metric(r.url, "servelab_router_retries_total", upstream=b.url,
                                reason="ejected")
        errors = router_metric(r.url, "servelab_router_upstream_errors_total", upstream=b.url,
                               kind="per_try_timeout")
    assert response.json()["model"] == "a" and (retried, errors) == (1, 0)


@pytest.mark.parametrize("sickness, reason", [("status", "http_5xx"), ("garbage", "invalid")])
def test_a_5xx_or_garbage_answer_is_retried_on_the_next_upstream(sickness, reason):
    with FakeUpstream("a") as a, FakeUpstream("b") as b, \
            retry_router([a.url, b.url], FakeClock()) as r:
        if sickness == "status":
            a.status = 500
        else:
            a.garbage = True
        response = post(r.url, {"prompt": "hi"})
        retried = router_metric(r.url, "servelab_router_retries_total", upstream=a.url,
                                reason=reason)
    assert response.status_code == 200 and response.json()["model"] == "b" and retried == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_connection_reset_before_any_byte_is_retried_on_the_next_upstream(stream):
    with ResettingUpstream() as resetting, FakeUpstream("b") as b, \
            retry_router([resetting.url, b.url], FakeClock()) as r:
        if stream:
            status, lines = stream_lines(r.url, {"prompt": "hi", "max_tokens": 1})
            assert (status, lines[0]) == (200, 'data: {"model": "b", "chunk": 0}')
        else:
            assert post(r.url, {"prompt": "hi"}).json()["model"] == "b"
        retried = router_metric(r.url, "servelab_router_retries_total", upstream=resetting.url,
                                reason="transport")
    assert resetting.streams == 1 and retried == 1 and len(b.bodies) == 1


def test_when_no_upstream_is_left_the_last_5xx_passes_through():
    with FakeUpstream("a") as a, FakeUpstream("b") as b, \
            retry_router([a.url, b.url], FakeClock()) as r:
        a.status = b.status = 503
        response = post(r.url, {"prompt": "hi"})
        denied = router_metric(r.url, "servelab_router_retries_denied_total", reason="upstreams")
    assert response.status_code == 503 and "b is sick" in response.text and denied == 1
    assert len(a.bodies) == len(b.bodies) == 1


@pytest.mark.parametrize("retry, reason", [({"retries": 0}, "retries"),
                                           ({"budget_min": 0, "budget_ratio": 0.0}, "budget")])
def test_retries_and_the_retry_budget_cap_the_tries(retry, reason):
    with FakeUpstream("a") as a, FakeUpstream("b") as b, \
            retry_router([a.url, b.url], FakeClock(), **retry) as r:
        a.status = 500
        response = post(r.url, {"prompt": "hi"})
        denied = router_metric(r.url, "servelab_router_retries_denied_total", reason=reason)
    assert response.status_code == 500 and denied == 1 and b.bodies == []


def test_the_request_budget_ends_the_tries_with_a_504(pool):
    """Per try 5 s, 7 s in all: the second try gets the 2 s left, then a 504."""
    clock = FakeClock()
    with FakeUpstream("a") as a, FakeUpstream("b") as b, \
            retry_router([a.url, b.url], clock, request_timeout_s=7.0) as r:
        a.gate.clear(), b.gate.clear()
        answer = pool.submit(post, r.url, {"prompt": "hi"})
        wait_until(lambda: in_flight(r, 0) == 1, "the first try reached a")
        clock.advance(PER_TRY_S)
        wait_until(lambda: in_flight(r, 1) == 1, "the second try reached b")
        clock.advance(2.0)
        response = answer.result(HANG_S)
        denied = router_metric(r.url, "servelab_router_retries_denied_total", reason="deadline")
        b_errors = router_metric(r.url, "servelab_router_upstream_errors_total", upstream=b.url,
                                 kind="per_try_timeout")
    error = response.json()["error"]
    assert response.status_code == 504 and error["code"] == "gateway_timeout"
    assert "time budget" in error["message"] and denied == 1
    assert b_errors == 0  # cut by the request's budget, not its own deadline: no fault of b's


def test_a_stream_that_has_sent_an_event_is_never_replayed():
    """The break after the first event ends the stream with an error event and [DONE]; the
    healthy upstream never sees the request."""
    with DyingUpstream() as dying, FakeUpstream("b") as b, \
            retry_router([dying.url, b.url], FakeClock()) as r, httpx.stream(
            "POST", f"{r.url}/v1/completions", json={"prompt": "hi", "stream": True},
            trust_env=False, timeout=HANG_S) as response:
        lines = response.iter_lines()
        assert next(lines) == 'data: {"chunk": 0}'
        dying.kill()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]" and "broke off" in json.loads(rest[0][6:])["error"]["message"]
    assert b.bodies == []


def test_a_started_stream_ends_with_an_error_event_when_the_request_budget_is_spent():
    clock = FakeClock()
    body = {"prompt": "hi", "max_tokens": 3, "stream": True}
    with FakeUpstream("a") as a, retry_router([a.url], clock, request_timeout_s=30.0) as r:
        a.gate.clear()  # the last event waits
        with httpx.stream("POST", f"{r.url}/v1/completions", json=body, trust_env=False,
                          timeout=HANG_S) as response:
            lines = response.iter_lines()
            assert json.loads(next(lines)[6:])["chunk"] == 0
            clock.advance(30.0)
            rest = [line for line in lines if line]
        wait_until(lambda: a.aborted == 1, "a saw the stream go")
    assert json.loads(rest[-2][6:])["error"]["code"] == "gateway_timeout"
    assert rest[-1] == "data: [DONE]"


def test_the_per_try_deadline_follows_max_tokens_and_the_tpot_read_from_metrics():
    cfg = RetryConfig()  # floor 10 s, headroom 4, 0.1 s a token until one is read
    up = Upstream("http://u", 0)
    assert cfg.per_try_s(16, up.tpot_s) == 10.0 and cfg.per_try_s(100, up.tpot_s) == 40.0
    text = ("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
            'vllm:inter_token_latency_seconds_sum{model_name="m"} %s\n'
            'vllm:inter_token_latency_seconds_count{model_name="m"} %s\n')
    up.take_reading(parse_reading(text % (2.0, 100)), None)  # the first reading: its mean
    assert up.tpot_s == pytest.approx(0.02)
    up.take_reading(parse_reading(text % (5.0, 200)), None)  # then the gaps since
    assert up.tpot_s == pytest.approx(0.03)
    up.take_reading(None, "down")  # a failed poll keeps the last estimate
    up.take_reading(parse_reading(text % (5.0, 200)), None)  # no new gap: kept too
    assert up.tpot_s == pytest.approx(0.03)
    assert cfg.per_try_s(1000, up.tpot_s) == pytest.approx(120.0)
    assert RetryConfig(per_try_timeout_s=3.0).per_try_s(1000, up.tpot_s) == 3.0


def test_the_tpot_comes_from_a_polled_upstream(pair_with_itl):
    a = pair_with_itl
    with retry_router([a.url], FakeClock()) as r:
        wait_until(lambda: r.state.upstreams[0].tpot_s is not None, "a poll read the ITL")
        health = httpx.get(f"{r.url}/health", trust_env=False, timeout=HANG_S).json()
    assert health["upstreams"][0]["tpot_s"] == pytest.approx(0.05)


@pytest.fixture
def pair_with_itl():
    with FakeUpstream("a") as a:
        a.itl = (1.0, 20)
        yield a


def test_the_retry_budget_is_a_share_of_recent_requests_with_a_minimum():
    budget = RetryBudget(RetryConfig(budget_ratio=0.2, budget_min=2, budget_window_s=10.0))
    for i in range(20):
        budget.request(float(i) / 10)
    assert [budget.allow(2.0) for _ in range(5)] == [True] * 4 + [False]  # 20% of 20
    assert not budget.allow(11.0)  # the retries at 2.0 still count
    assert [budget.allow(12.5) for _ in range(3)] == [True, True, False]  # the minimum


@pytest.mark.parametrize("kwargs", [{"retries": -1}, {"per_try_timeout_s": 0.0},
                                    {"per_try_floor_s": 0.0}, {"request_timeout_s": -1.0},
                                    {"budget_ratio": -0.1}, {"budget_window_s": 0.0}])
def test_retry_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match="route"):
        RetryConfig(**kwargs)


def test_an_ejection_with_nowhere_else_to_go_lets_the_request_wait_on(pool):
    clock = FakeClock()
    with FakeUpstream("b") as b, retry_router([b.url], clock, checks=True) as r:
        b.gate.clear()
        answer = pool.submit(post, r.url, {"prompt": "hi"})
        wait_until(lambda: in_flight(r, 0) == 1, "the request reached b")
        b.healthy = False
        wait_until(lambda: r.state.upstreams[0].health.ejected_until is not None, "b ejected")
        b.gate.set()
        response = answer.result(HANG_S)
    assert response.status_code == 200 and response.json()["model"] == "b"
