"""`servelab route` and sick upstreams: the health record's ejection and back-off on their
own, then hung (never answering) upstreams behind a running router, whose clock the test
moves (per-try deadlines and back-offs run on it). A hung fake never answers, so its
timeouts always fire; the healthy one answers at once; nothing here decides by how fast the
machine is."""

from __future__ import annotations

import concurrent.futures
import time
from collections import Counter

import httpx
import pytest

from servelab.route.app import RouterThread
from servelab.route.health import Health, HealthConfig
from servelab.route.state import RouteConfig
from sim.cluster.router import RouterConfig
from tests.servelab.route.route_fakes import FakeClock, FakeUpstream
from tests.servelab.route.test_route import post, router_metric
from tests.servelab.serve.helpers import HANG_S, wait_until

BACKOFF_S = 1000.0  # on the fake clock: nothing comes back until the test advances it
# A hung upstream reaches these every time; the healthy fake, which answers at once, must
# never reach them, even on a loaded machine whose threads wait their turn for a while (at
# 0.3 s, three checks of the healthy fake in a row timed out under load: both upstreams out,
# and a request sent to the hung one in the panic that followed).
CHECK_TIMEOUT_S = 1.0
CONNECT_TIMEOUT_S = 1.0  # the healthy fake's connections: a hung upstream's are made at once
FIRST_BYTE_TIMEOUT_S = 2.0


def hung_router(urls: list[str], clock: FakeClock, checks: bool) -> RouterThread:
    """Round-robin with timeouts a hung upstream always reaches and ejection after 3
    failures for BACKOFF_S fake seconds."""
    health = HealthConfig(check_interval_s=0.05 if checks else 0.0,
                          check_timeout_s=CHECK_TIMEOUT_S, eject_after_failures=3,
                          ejection_base_s=BACKOFF_S, ejection_max_s=4 * BACKOFF_S)
    config = RouteConfig(tuple(urls), RouterConfig("round-robin"), 0.05,
                         connect_timeout_s=CONNECT_TIMEOUT_S,
                         first_byte_timeout_s=FIRST_BYTE_TIMEOUT_S,
                         health=health)
    return RouterThread(config, clock=clock, clock_step_s=0.01)


@pytest.fixture
def stopped():
    """An upstream that listens and never answers (a process under SIGSTOP) until started."""
    upstream = FakeUpstream("b")
    yield upstream
    upstream.__exit__()


def upstream_health(r: RouterThread, url: str) -> dict:
    body = httpx.get(f"{r.url}/health", trust_env=False, timeout=HANG_S).json()
    return next(u for u in body["upstreams"] if u["url"] == url)


def wait_for_state(r: RouterThread, url: str, state: str) -> dict:
    """Until the router's /health reports the upstream in `state` (the limit only keeps a
    broken router from hanging the suite)."""
    deadline = time.monotonic() + 30.0
    while (entry := upstream_health(r, url))["state"] != state:
        assert time.monotonic() < deadline, f"{url} never became {state}: {entry}"
        time.sleep(0.02)
    return entry


def answers(r: RouterThread, count: int) -> Counter:
    """`count` requests, one after another: the status and answering upstream of each.
    (Round-robin alternates, so a run of them shows who is in rotation; sent at once, they
    made the router open as many connections to the healthy fake, which a loaded machine
    took past the connect timeout.)"""
    responses = [post(r.url, {"prompt": "hi"}) for _ in range(count)]
    return Counter((x.status_code, x.json().get("model", "")) for x in responses)


def test_hung_upstream_is_ejected_by_checks_and_back_in_rotation_after_the_backoff(stopped):
    clock = FakeClock()
    with FakeUpstream("a") as a, hung_router([a.url, stopped.url], clock, checks=True) as r:
        entry = wait_for_state(r, stopped.url, "ejected")
        assert entry["consecutive_check_failures"] >= 3 and entry["ejections"] == 1
        assert entry["ejected_until"] > time.time() + BACKOFF_S / 2
        assert f"no answer within {CHECK_TIMEOUT_S} s" in entry["last_failure"]
        assert answers(r, 100) == {(200, "a"): 100}
        assert router_metric(r.url, "servelab_router_upstream_ejected", upstream=stopped.url) == 1
        assert router_metric(r.url, "servelab_router_ejections_total", upstream=stopped.url) == 1
        assert router_metric(r.url, "servelab_router_upstream_ejected", upstream=a.url) == 0
        stopped.start()  # SIGCONT: checks pass, but the back-off is not over
        while router_metric(r.url, "servelab_router_health_checks_total", upstream=stopped.url,
                            result="pass") < 1:
            time.sleep(0.02)
        assert upstream_health(r, stopped.url)["state"] == "ejected"
        clock.advance(BACKOFF_S)
        wait_for_state(r, stopped.url, "healthy")
        assert answers(r, 10) == {(200, "a"): 5, (200, "b"): 5}
        assert router_metric(r.url, "servelab_router_upstream_ejected", upstream=stopped.url) == 0


def past_the_hang(r: RouterThread, clock: FakeClock, hung: int, body: dict) -> httpx.Response:
    """Send `body`; whenever a try waits at upstream `hung`, move the clock past the
    first-byte timeout (the per-try deadline of a short stream)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(post, r.url, body)
        while not answer.done():
            if r.state.upstreams[hung].in_flight:
                clock.advance(FIRST_BYTE_TIMEOUT_S)
                while r.state.upstreams[hung].in_flight and not answer.done():
                    time.sleep(0.005)
            time.sleep(0.005)
        return answer.result()


def test_requests_to_a_hung_upstream_time_out_go_elsewhere_then_eject_it(stopped):
    """Without health checks: each streamed request there times out at the first-byte
    timeout and, its client having seen nothing, goes to a; the third ejects it."""
    clock = FakeClock()
    with FakeUpstream("a") as a, hung_router([a.url, stopped.url], clock, checks=False) as r:
        streams = [past_the_hang(r, clock, 1, {"prompt": "hi", "stream": True})
                   for _ in range(6)]
        entry = upstream_health(r, stopped.url)
        assert router_metric(r.url, "servelab_router_upstream_errors_total",
                             upstream=stopped.url, kind="first_byte_timeout") == 3
        assert router_metric(r.url, "servelab_router_retries_total", upstream=stopped.url,
                             reason="timeout") == 3
        assert answers(r, 20) == {(200, "a"): 20}
        stopped.start()
        clock.advance(BACKOFF_S)  # the back-off is over: requests try it again
        names = [post(r.url, {"prompt": "hi"}).json()["model"] for _ in range(4)]
        assert upstream_health(r, stopped.url)["state"] == "healthy"
    assert [x.status_code for x in streams] == [200] * 6
    assert all('"model": "a"' in x.text for x in streams)
    assert entry["state"] == "ejected" and entry["consecutive_failures"] == 3
    assert "first_byte_timeout" in entry["last_failure"]
    assert sorted(names) == ["a", "a", "b", "b"]


def test_every_upstream_ejected_still_routes_and_health_says_no_upstream(stopped):
    clock = FakeClock()
    with hung_router([stopped.url], clock, checks=True) as r:
        wait_for_state(r, stopped.url, "ejected")
        assert httpx.get(f"{r.url}/health", trust_env=False, timeout=HANG_S).status_code == 503
        stopped.start()
        # A panic: with nothing in rotation the router still tries the ejected upstream.
        assert post(r.url, {"prompt": "hi"}).json()["model"] == "b"


def test_refused_connection_is_retried_and_counted():
    with FakeUpstream("a") as a, FakeUpstream("b") as b, \
            RouterThread(RouteConfig((a.url, b.url), RouterConfig("round-robin"), 60.0,
                                     health=HealthConfig(check_interval_s=0.0))) as r:
        b.__exit__()
        names = [post(r.url, {"prompt": "hi"}).json()["model"] for _ in range(4)]
        assert router_metric(r.url, "servelab_router_retries_total", upstream=b.url,
                             reason="connect") == 1
    assert names == ["a"] * 4


def health(**kwargs) -> Health:
    return Health(HealthConfig(**{"eject_after_failures": 2, "ejection_base_s": 10.0,
                                  "ejection_max_s": 40.0, **kwargs}))


def test_backoff_doubles_to_its_cap_and_a_pass_restores_only_after_it():
    h = health()
    assert not h.request_failed(0.0, "x") and h.request_failed(1.0, "x")
    assert (h.state(1.0), h.ejected_until) == ("ejected", 11.0)
    assert not h.request_failed(5.0, "late") and h.ejected_until == 11.0  # not extended
    h.check_passed(10.0)
    assert h.state(10.0) == "ejected" and not h.routable(10.0)
    assert h.state(11.0) == "probing" and not h.routable(11.0)  # waits for a passing check
    assert h.check_failed(12.0, "x") and h.ejected_until == 32.0  # probing: one failure
    assert h.check_failed(32.0, "x") and h.ejected_until == 72.0  # 40, the cap
    h.check_passed(72.0)
    assert h.state(72.0) == "healthy" and h.check_failures == h.request_failures == 0


def test_backoff_starts_over_after_a_long_stay_in_rotation():
    h = health()
    h.request_failed(0.0, "x"), h.request_failed(0.0, "x")
    h.request_succeeded(10.0)  # a success after the back-off restores too
    assert h.state(10.0) == "healthy"
    h.request_failed(20.0, "x"), h.request_failed(20.0, "x")
    assert h.ejected_until == 40.0  # second ejection within 40 s: doubled
    h.check_passed(40.0)
    h.check_failed(100.0, "x"), h.check_failed(100.0, "x")
    assert h.ejected_until == 110.0 and h.ejections == 1


def test_request_and_check_failures_are_separate_streaks():
    h = health(eject_after_failures=3)
    for now in (0.0, 1.0):
        h.request_failed(now, "x")
        h.check_passed(now)  # /health answering does not excuse failing completions
    assert h.request_failed(2.0, "x")


def test_without_checks_the_upstream_is_tried_again_after_the_backoff():
    h = health(check_interval_s=0.0)
    h.request_failed(0.0, "x"), h.request_failed(0.0, "x")
    assert not h.routable(9.0) and h.routable(10.0)
    assert h.request_failed(10.0, "x") and h.ejected_until == 30.0


@pytest.mark.parametrize("kwargs", [{"check_interval_s": -1.0}, {"check_timeout_s": 0.0},
                                    {"eject_after_failures": 0}, {"ejection_base_s": 0.0},
                                    {"ejection_base_s": 5.0, "ejection_max_s": 1.0},
                                    {"check_path": "health"}])
def test_health_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match="route"):
        HealthConfig(**kwargs)


def test_first_byte_timeout_must_exceed_the_connect_timeout():
    with pytest.raises(ValueError, match="first_byte_timeout_s"):
        RouteConfig(("http://x",), connect_timeout_s=5.0, first_byte_timeout_s=5.0)



def test_a_non_streamed_answer_has_a_deadline_that_grows_with_max_tokens(stopped):
    """Its answer comes whole: 100 tokens at the assumed 0.1 s each, 4 times over, is 40 s,
    far past the first-byte timeout and the 10 s floor, and a long generation is no fault."""
    clock = FakeClock()
    with (hung_router([stopped.url], clock, checks=False) as r,
          concurrent.futures.ThreadPoolExecutor(1) as pool):
        answer = pool.submit(post, r.url, {"prompt": "hi", "max_tokens": 100})
        wait_until(lambda: r.state.upstreams[0].in_flight == 1, "the request was sent")
        clock.advance(39.0)
        stopped.start()
        response = answer.result()
    assert response.status_code == 200 and response.json()["model"] == "b"
