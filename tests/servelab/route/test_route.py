"""`servelab route`: routing choices, streaming relay, failover and errors against small fake
upstreams, the load and prefix bookkeeping on their own, and a replay through real servers."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from servelab.bench.client import BenchConfig, replay_trace
from servelab.route.app import RouterThread
from servelab.route.prefix import BYTES_PER_TOKEN, PrefixIndex, kv_tokens_estimate, prompt_blocks
from servelab.route.state import RouteConfig
from servelab.route.upstreams import Reading, Upstream, parse_reading
from sim.cluster.router import ReplicaLoad, RouterConfig
from tests.servelab.route.route_fakes import FakeUpstream, dead_url
from tests.servelab.serve.helpers import HANG_S, async_client, start_server, wait_until
from workloads import open_trace


def router(urls: list[str], name: str = "round-robin", interval_s: float = 0.05,
           **kwargs) -> RouterThread:
    return RouterThread(RouteConfig(tuple(urls), RouterConfig(name), interval_s, **kwargs))


def post(url: str, body: dict, timeout: float = HANG_S, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, trust_env=False, timeout=timeout,
                      **kwargs)


def router_metric(url: str, name: str, **labels: str) -> float:
    """A sample of the router's /metrics (0 if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # as exposed
    for line in httpx.get(f"{url}/metrics", trust_env=False, timeout=HANG_S).text.splitlines():
        if line.startswith(f"{name}{{{want}}}" if want else f"{name} "):
            return float(line.split()[-1])
    return 0.0


def length_finishes(url: str) -> float:
    """An upstream's vllm:request_success_total{finished_reason="length"}."""
    for line in httpx.get(f"{url}/metrics", trust_env=False, timeout=HANG_S).text.splitlines():
        if line.startswith("vllm:request_success_total") and '"length"' in line:
            return float(line.split()[-1])
    return 0.0


@pytest.fixture(scope="module")
def fakes():
    with FakeUpstream("a") as a, FakeUpstream("b") as b:
        yield a, b


@pytest.fixture
def pair(fakes):
    for fake in fakes:
        fake.reset()
    return fakes


def test_round_robin_alternates(pair):
    a, b = pair
    with router([a.url, b.url]) as r:
        names = [post(r.url, {"prompt": "hi"}).json()["model"] for _ in range(4)]
    assert names == ["a", "b", "a", "b"]


def test_least_requests_prefers_the_upstream_reporting_idle(pair):
    a, b = pair
    a.running = 4
    with router([a.url, b.url], "least-requests") as r:
        names = [post(r.url, {"prompt": "hi"}).json()["model"] for _ in range(4)]
    assert names == ["b"] * 4


def burst(r: RouterThread, pair: tuple[FakeUpstream, FakeUpstream], body: dict,
          count: int) -> Counter:
    """Send `count` requests at once, all answered only once all have arrived upstream:
    which upstream answered how many."""
    a, b = pair
    a.gate.clear(), b.gate.clear()

    async def main() -> list[str]:
        async with async_client(r.url) as client:
            tasks = [asyncio.ensure_future(client.post("/v1/completions", json=body))
                     for _ in range(count)]
            while len(a.bodies) + len(b.bodies) < count:
                await asyncio.sleep(0.01)
            a.gate.set(), b.gate.set()
            return [(await t).json()["model"] for t in tasks]

    return Counter(asyncio.run(main()))


def test_least_requests_counts_requests_sent_since_the_last_poll(pair):
    """No poll during the burst: without its own counts the router sends all six to b."""
    a, b = pair
    a.running = 2
    with router([a.url, b.url], "least-requests", interval_s=60.0) as r:
        assert burst(r, pair, {"prompt": "hi"}, 6) == {"a": 2, "b": 4}


def test_least_kv_adds_the_kv_of_requests_sent_since_the_last_poll(pair):
    """Each request holds 50 of a 1000-token pool: 0.10 vs 0.12 alternates after one."""
    a, b = pair
    a.kv_usage, b.kv_usage = 0.10, 0.12
    body = {"prompt": list(range(40)), "max_tokens": 10}
    with router([a.url, b.url], "least-kv", interval_s=60.0) as r:
        assert burst(r, pair, body, 4) == {"a": 2, "b": 2}


def test_prefix_aware_sends_a_repeated_prompt_back_to_its_upstream(pair):
    a, b = pair
    system = "You are a careful assistant. " * 12  # 348 bytes: five 64-byte blocks
    ids = list(range(100, 164))  # four 16-token blocks
    with router([a.url, b.url], "prefix-aware") as r:
        first = post(r.url, {"prompt": system + "Q1"}).json()["model"]
        again = [post(r.url, {"prompt": system + f"Q{i}"}).json()["model"] for i in range(2, 6)]
        by_ids = post(r.url, {"prompt": ids}).json()["model"]
        longer = [post(r.url, {"prompt": ids + [7] * i}).json()["model"] for i in range(1, 5)]
        assert router_metric(r.url, "servelab_router_prefix_index_keys") == 5 + 4
    assert again == [first] * 4  # round-robin would alternate
    assert longer == [by_ids] * 4


def test_stream_is_relayed_chunk_by_chunk_and_ends_with_done(pair):
    a, b = pair
    a.gate.clear()  # the last chunk waits until the first has reached the client
    with router([a.url, b.url]) as r, httpx.stream(
            "POST", f"{r.url}/v1/completions", json={"prompt": "hi", "stream": True,
                                                     "max_tokens": 4},
            trust_env=False, timeout=HANG_S) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = []
        for line in response.iter_lines():
            if line:
                events.append(line)
                a.gate.set()  # reached only if the relay did not wait for the whole body
    assert events[:4] == [f'data: {{"model": "a", "chunk": {i}}}' for i in range(4)]
    assert events[4:] == ["data: [DONE]"]


def test_client_disconnect_closes_the_upstream_stream(pair):
    a, b = pair
    a.gate.clear()  # the stream never ends on its own
    with router([a.url, b.url]) as r:
        with httpx.stream("POST", f"{r.url}/v1/completions", trust_env=False, timeout=HANG_S,
                          json={"prompt": "hi", "stream": True, "max_tokens": 5}) as response:
            next(response.iter_lines())  # one chunk, then leave
        wait_until_closed(r, a)


def test_client_that_leaves_a_non_streamed_request_closes_the_upstream_request(pair):
    a, b = pair
    a.gate.clear()  # the answer never comes
    with router([a.url, b.url]) as r:
        with pytest.raises(httpx.ReadTimeout):
            post(r.url, {"prompt": "hi"}, timeout=0.3)
        wait_until_closed(r, a)


def wait_until_closed(r: RouterThread, upstream: FakeUpstream) -> None:
    """Until the upstream saw its reader leave and the router counts nothing in flight."""
    wait_until(lambda: upstream.aborted >= 1 and router_metric(
        r.url, "servelab_router_in_flight", upstream=upstream.url) == 0,
        "the upstream request was closed")


def test_refused_upstream_falls_over_to_the_live_one(pair):
    a, _ = pair
    with FakeUpstream("b") as b, router([a.url, b.url], interval_s=60.0) as r:
        b.__exit__()  # no poll notices b going away
        names = [post(r.url, {"prompt": "hi"}).json()["model"] for _ in range(4)]
        assert router_metric(r.url, "servelab_router_upstream_errors_total", kind="connect",
                             upstream=b.url) == 1  # then b is skipped as unreachable
        models = httpx.get(f"{r.url}/v1/models", trust_env=False, timeout=HANG_S)
        assert models.json()["data"][0]["id"] == "a"
        assert httpx.get(f"{r.url}/health", trust_env=False, timeout=HANG_S).status_code == 200
    assert names == ["a"] * 4


def test_upstream_dead_at_start_is_skipped(pair):
    a, _ = pair
    with router([dead_url(), a.url]) as r:
        names = [post(r.url, {"prompt": "hi"}).json()["model"] for _ in range(3)]
        assert router_metric(r.url, "servelab_router_upstream_reachable",
                             upstream=r.state.upstreams[0].url) == 0
    assert names == ["a"] * 3


def test_every_upstream_dead_is_a_502_error_object():
    with router([dead_url(), dead_url()]) as r:
        response = post(r.url, {"prompt": "hi"})
        assert httpx.get(f"{r.url}/health", trust_env=False, timeout=HANG_S).status_code == 503
        assert httpx.get(f"{r.url}/v1/models", trust_env=False, timeout=HANG_S).status_code == 502
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["type"] == "server_error" and "no upstream accepted" in error["message"]


def test_non_json_and_invalid_bodies_are_refused_by_the_router_itself(pair):
    a, b = pair
    with router([a.url, b.url]) as r:
        junk = httpx.post(f"{r.url}/v1/completions", content=b"{nope", trust_env=False,
                          timeout=HANG_S)
        bad = post(r.url, {"max_tokens": 3})
    assert junk.status_code == 400 and "not valid JSON" in junk.json()["error"]["message"]
    # The server's own parser: the same 400 naming the field, nothing forwarded.
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    assert a.bodies == b.bodies == []


def test_api_key_is_required_and_forwarded(pair):
    a, b = pair
    with router([a.url, b.url], api_key="sesame") as r:
        assert post(r.url, {"prompt": "hi"}).status_code == 401
        ok = post(r.url, {"prompt": "hi"}, headers={"Authorization": "Bearer sesame"})
    assert ok.status_code == 200 and a.auth == ["Bearer sesame"]


def test_upstream_without_metrics_is_loaded_by_router_in_flight_only(pair):
    a, b = pair
    a.metrics, b.running = False, 3
    with router([a.url, b.url], "least-requests") as r:
        names = [post(r.url, {"prompt": "hi"}).json()["model"] for _ in range(3)]
        health = httpx.get(f"{r.url}/health", trust_env=False, timeout=HANG_S).json()
    assert names == ["a"] * 3
    assert "HTTP 404" in health["upstreams"][0]["metrics_error"]


def test_parse_reading_sums_engines_reads_the_old_kv_name_and_the_pool():
    text = "".join(f'{name}{{engine="{i}"}} {value}\n' for name, values in (
        ("vllm:num_requests_running", (2, 3)), ("vllm:num_requests_waiting", (1, 0)),
        ("vllm:gpu_cache_usage_perc", (0.2, 0.4))) for i, value in enumerate(values))
    text += 'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1\n'
    reading = parse_reading(text)
    assert reading.load == ReplicaLoad(5, 1, pytest.approx(0.3))
    assert reading.kv_pool_tokens == 1600
    assert parse_reading(text.replace('"100"', '"None"')).kv_pool_tokens is None
    with pytest.raises(ValueError, match="num_requests_running"):
        parse_reading("other_metric 1\n")


def test_upstream_load_adds_only_requests_sent_since_the_reading():
    up = Upstream("http://u", 0)
    before = up.begin(kv_tokens=40)
    assert up.load(7) == ReplicaLoad(1, 0, 0.0, 7)  # no reading: the router's count
    up.take_reading(Reading(ReplicaLoad(4, 2, 0.5), kv_pool_tokens=1000), None)
    after = up.begin(kv_tokens=100)  # the reading includes `before`, not this one
    assert up.load() == ReplicaLoad(4, 3, pytest.approx(0.6))
    up.end(before)
    assert up.load() == ReplicaLoad(4, 3, pytest.approx(0.6))
    up.end(after)
    assert up.load() == ReplicaLoad(4, 2, 0.5) and up.in_flight == 0


def test_kv_tokens_estimate_is_prompt_plus_max_tokens():
    assert kv_tokens_estimate({"prompt": [1] * 30, "max_tokens": 10}) == 40
    assert kv_tokens_estimate({"prompt": "x" * 9}) == 3 + 16  # bytes/4 rounded up, default 16
    assert kv_tokens_estimate({"messages": [], "max_completion_tokens": 5}) == 5
    assert kv_tokens_estimate(["not", "a", "dict"]) == 16


def test_prefix_index_longest_run_per_upstream_and_lru_keeps_prefixes():
    blocks = prompt_blocks({"prompt": list(range(48))}, 16)
    assert (blocks.unit, blocks.prompt_len, len(blocks.keys)) == ("tokens", 48, 3)
    text = prompt_blocks({"prompt": "x" * 130}, 16)
    assert (text.unit, text.prompt_len, text.block_len) == ("bytes", 130, 16 * BYTES_PER_TOKEN)
    assert len(text.keys) == 2
    chat = prompt_blocks({"messages": [{"role": "user", "content": "y" * 70}]}, 16)
    assert chat.unit == "bytes" and len(chat.keys) == 1
    index = PrefixIndex(max_keys=4)
    index.record(blocks.keys[:2], 0)
    index.record(blocks.keys, 1)
    assert index.matched_blocks(blocks.keys, 3) == [2, 3, 0]
    other = prompt_blocks({"prompt": list(range(100, 132))}, 16).keys
    index.record(other, 2)  # over capacity: the oldest deepest block goes first
    assert index.matched_blocks(blocks.keys, 3) == [2, 2, 0] and len(index) == 4


@pytest.mark.parametrize("kwargs", [{"upstreams": ()}, {"upstreams": ("ftp://x",)},
                                    {"upstreams": ("http://x/",)},
                                    {"upstreams": ("http://x", "http://x")},
                                    {"metrics_interval_s": 0.0}, {"prefix_max_keys": 0},
                                    {"api_key": ""}])
def test_route_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match="route"):
        RouteConfig(**{"upstreams": ("http://x",), **kwargs})


def test_replay_through_router_completes_every_request_on_both_upstreams(tiny_model):
    """bench-serve's client, 200 requests at 100/s, through least-requests to two servers."""
    trace = open_trace("synthetic:n=200,rate=100,prompt=fixed(32),output=fixed(4)")
    with start_server(tiny_model) as s1, start_server(tiny_model) as s2, \
            router([s1.url, s2.url], "least-requests") as r:
        _, _, result = asyncio.run(replay_trace(trace, BenchConfig(r.url)))
        served = [router_metric(r.url, "servelab_router_requests_total", upstream=s.url)
                  for s in (s1, s2)]
        finished = [length_finishes(s.url) for s in (s1, s2)]
    assert result.errors == []
    assert all(len(req.output_token_ids) == 4 for req in result.requests)
    assert sum(served) == 200 and min(served) > 0
    assert finished == served  # each upstream finished what the router sent it
