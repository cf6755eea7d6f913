"""The load client against a scripted server: a request that never reached the server is sent
once more on a new connection, one the server may have started never is, and is counted."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from servelab.bench.client import BenchConfig, BenchRequest, run_bench, summarize_bench
from servelab.bench.connection import (
    encode_json,
    make_client,
    never_reached_server,
    post_once_more_if_unsent,
)
from sim.engine.core import FinishReason
from tests.servelab.bench.client_fakes import Script, ScriptedServer


def requests_at(arrivals: list[float], max_tokens: list[int]) -> list[BenchRequest]:
    """One request per arrival; the scripted server names each by its max_tokens."""
    return [BenchRequest(f"r{i}", at, [7, 8, 9], n)
            for i, (at, n) in enumerate(zip(arrivals, max_tokens, strict=True))]


def test_idle_gaps_longer_than_the_servers_keepalive_lose_no_request():
    # The server keeps an idle connection 1 s and drops it as the next request arrives, the
    # client reuses one for 4 s, the requests come 2 s apart: every reuse meets a closed
    # connection, and every such request is sent again.
    arrivals, lengths = [0.0, 0.0, 2.0, 2.0, 4.0], [3, 4, 5, 6, 7]
    with ScriptedServer(Script(keepalive_s=1.0)) as server:
        result = asyncio.run(run_bench(requests_at(arrivals, lengths), BenchConfig(server.url)))
    assert result.errors == []
    assert [r.finish_reason for r in result.requests] == [FinishReason.LENGTH] * 5
    assert [len(r.token_times_s) for r in result.requests] == lengths
    assert all(server.seen[n] == 1 for n in lengths)  # each served once
    assert result.retried == server.closed_idle["/v1/completions"]


def test_a_request_on_a_pooled_connection_the_server_closed_is_sent_again():
    # keepalive 0: every request on a connection that served one is closed unanswered.
    lengths = [3, 4, 5, 6]
    with ScriptedServer(Script(keepalive_s=0.0)) as server:
        config = BenchConfig(server.url, max_concurrency=1)
        result = asyncio.run(run_bench(requests_at([0.0] * 4, lengths), config))
    assert result.errors == []
    assert all(len(r.token_times_s) == n for r, n in zip(result.requests, lengths, strict=True))
    # A request that met the pooled connection closed went again on a connection of its own.
    assert server.closed_idle["/v1/completions"] == result.retried >= 1
    assert all(server.seen[n] == 1 for n in lengths)


@pytest.mark.parametrize("drop", ["drop_after_headers", "drop_after_a_chunk"])
def test_a_connection_dropped_mid_request_is_one_failure_never_sent_again(drop):
    # One at a time: the dropped request goes out on the pooled connection of the one before.
    script = Script(**{drop: {4}})
    with ScriptedServer(script) as server:
        config = BenchConfig(server.url, max_concurrency=1)
        result = asyncio.run(run_bench(requests_at([0.0] * 3, [3, 4, 5]), config))
    assert server.seen == {3: 1, 4: 1, 5: 1}
    assert result.retried == 0
    assert [r.finish_reason for r in result.requests] == [
        FinishReason.LENGTH, FinishReason.FAILED, FinishReason.LENGTH]
    assert len(result.errors) == 1 and result.errors[0].startswith("r1: ")
    summary = summarize_bench(result)
    assert summary["completed"] == 2 and summary["failed"] == 1 and summary["retried"] == 0


def test_a_new_connection_closed_unanswered_is_a_failure_never_sent_again():
    # No response byte, but on a connection of its own (the server keeps none alive): the
    # server read it and may have started it.
    with ScriptedServer(Script(drop_unanswered={4}, keep_alive=False)) as server:
        config = BenchConfig(server.url, max_concurrency=1)
        result = asyncio.run(run_bench(requests_at([0.0], [4]), config))
    assert server.seen == {4: 1}
    assert result.retried == 0 and result.requests[0].finish_reason is FinishReason.FAILED
    assert "ServerDisconnectedError" in result.errors[0]


def free_port() -> int:
    """A loopback port nothing listens on (bound, read and closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_connection_that_cannot_be_opened_is_tried_once_more_then_raised():
    url = f"http://127.0.0.1:{free_port()}/"
    tries = []

    async def count(*_: object) -> None:
        tries.append(1)

    async def post() -> None:
        tracing = aiohttp.TraceConfig()
        tracing.on_connection_create_start.append(count)
        async with aiohttp.ClientSession(url, trace_configs=[tracing]) as client, \
                aiohttp.ClientSession(url, trace_configs=[tracing]) as fresh:
            await post_once_more_if_unsent(client, fresh, "v1/completions", {})

    with pytest.raises(aiohttp.ClientConnectorError):
        asyncio.run(post())
    assert len(tries) == 2


def test_only_errors_before_any_response_byte_on_a_reused_connection_count_as_unsent():
    closed = aiohttp.ServerDisconnectedError()
    assert never_reached_server(closed, reused=True)
    assert not never_reached_server(closed, reused=False)
    reset = aiohttp.ClientOSError(104, "Connection reset by peer")
    assert never_reached_server(reset, reused=True)
    assert not never_reached_server(reset, reused=False)
    partial = aiohttp.ServerDisconnectedError(object())  # a response begun, then cut off
    partial.message = object()
    assert not never_reached_server(partial, reused=True)
    assert not never_reached_server(aiohttp.ClientPayloadError("cut"), reused=True)
    assert not never_reached_server(asyncio.TimeoutError(), reused=True)


def test_a_try_counts_as_sent_once_its_body_is_on_the_connection():
    # keepalive 0: the second request meets its pooled connection closed and goes again on
    # a new one; each try whose body went out says so, the one that never connected never.
    calls: list[str] = []

    async def post(url: str, label: str) -> bool:
        config = BenchConfig(url)
        async with make_client(config) as client, make_client(config, pooled=False) as fresh:
            body = encode_json({"prompt": [7, 8, 9], "max_tokens": 3, "stream": True})
            for _ in range(2):
                response, again = await post_once_more_if_unsent(
                    client, fresh, "v1/completions", body, lambda: calls.append(label))
                async with response:
                    await response.read()
            return again

    with ScriptedServer(Script(keepalive_s=0.0)) as server:
        retried = asyncio.run(post(server.url, "served"))
    assert retried and calls == ["served"] * (2 + server.closed_idle["/v1/completions"])
    with pytest.raises(aiohttp.ClientConnectorError):
        asyncio.run(post(f"http://127.0.0.1:{free_port()}/", "refused"))
    assert "refused" not in calls
