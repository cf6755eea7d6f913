"""`servelab route` passes through what it does not own: header bytes both ways (a non-ASCII
API key reaches `servelab serve` as sent), and a stream that an upstream breaks off ends as
`servelab serve` ends its own, with an error event and then `data: [DONE]`."""

from __future__ import annotations

import asyncio
import json

import httpx

from tests.servelab.route.route_fakes import DyingUpstream, FakeUpstream
from tests.servelab.route.test_route import post, router
from tests.servelab.serve.helpers import HANG_S, async_client, start_server

KEY = "ключ"
TENANT = "тенант"


def test_non_ascii_header_values_reach_the_upstream_and_come_back_as_sent():
    sent = {b"authorization": f"Bearer {KEY}".encode(), b"x-tenant": TENANT.encode()}
    with FakeUpstream("a") as a, router([a.url]) as r:
        response = post(r.url, {"prompt": "hi"}, headers=sent)
        received = dict(a.raw_headers[0])
    assert response.status_code == 200
    assert received[b"authorization"] == b"Bearer \xd0\xba\xd0\xbb\xd1\x8e\xd1\x87"
    assert received[b"x-tenant"] == sent[b"x-tenant"]
    assert dict(response.headers.raw)[b"x-echo-tenant"] == sent[b"x-tenant"]


def test_header_that_is_not_utf8_still_reaches_the_upstream():
    """Not UTF-8: the HTTP client can only send its latin-1 reading, re-encoded."""
    with FakeUpstream("a") as a, router([a.url]) as r:
        response = post(r.url, {"prompt": "hi"}, headers={b"x-tenant": b"caf\xe9"})
        received = dict(a.raw_headers[0])
    assert response.status_code == 200 and received[b"x-tenant"] == "café".encode()


def test_serve_with_a_non_ascii_api_key_accepts_it_through_the_router(tiny_model):
    body = {"prompt": "hi", "max_tokens": 2}
    with start_server(tiny_model, api_key=KEY) as s, router([s.url]) as r:
        right = post(r.url, body, headers={"Authorization": f"Bearer {KEY}".encode()})
        wrong = post(r.url, body, headers={"Authorization": "Bearer ключи".encode()})
    assert right.status_code == 200, right.text
    assert wrong.status_code == 401


def test_a_stream_broken_off_upstream_ends_with_an_error_event_and_done():
    with DyingUpstream() as dying, router([dying.url]) as r, httpx.stream(
            "POST", f"{r.url}/v1/completions", json={"prompt": "hi", "stream": True},
            trust_env=False, timeout=HANG_S) as response:
        lines = response.iter_lines()
        assert next(lines) == 'data: {"chunk": 0}'
        dying.kill()
        rest = [line for line in lines if line]
    assert len(rest) == 2 and rest[1] == "data: [DONE]"  # half an event is never relayed
    error = json.loads(rest[0][len("data: "):])["error"]
    assert error["code"] == "bad_gateway" and "broke off the stream" in error["message"]


def test_an_upstream_killed_under_200_streams_ends_each_with_done_and_the_router_serves_on():
    """Half the streams on an upstream that dies, half held open on a live one: every
    stream ends with [DONE], the dead one's with an error event before it."""
    count = 200
    with DyingUpstream() as dying, FakeUpstream("b") as b, router([dying.url, b.url]) as r:
        b.gate.clear()  # b's streams wait before their last chunk

        async def main() -> list[list[str]]:
            started: list[int] = []  # streams whose first event reached the client

            async def one(client: httpx.AsyncClient) -> list[str]:
                body = {"prompt": "hi", "stream": True, "max_tokens": 3}
                async with client.stream("POST", "/v1/completions", json=body) as resp:
                    assert resp.status_code == 200
                    lines = resp.aiter_lines()
                    first = await anext(lines)
                    started.append(1)
                    return [first] + [line async for line in lines if line]

            async with async_client(r.url) as client:
                tasks = [asyncio.ensure_future(one(client)) for _ in range(count)]
                # Kill only once every first event is through: a reset discards what the
                # router had not read yet, and each stream here is to show a break after it.
                while len(started) < count:
                    await asyncio.sleep(0.01)
                dying.kill()
                b.gate.set()
                return await asyncio.gather(*tasks)

        streams = asyncio.run(main())
        after = [post(r.url, {"prompt": "hi"}) for _ in range(6)]
        status = httpx.get(f"{r.url}/health", trust_env=False, timeout=HANG_S).json()["status"]
    assert all(events[-1] == "data: [DONE]" for events in streams)
    broken = [events for events in streams if '"error"' in events[-2]]
    assert len(broken) == dying.streams and 0 < len(broken) < count
    assert all(events[0] == 'data: {"chunk": 0}' and len(events) == 3 for events in broken)
    assert [x.status_code for x in after] == [200] * 6
    assert {x.json()["model"] for x in after} == {"b"} and status == "ok"
