"""Bodies that once got a 500 or a wrong answer, through the server and through the router in
front of it: every router policy refuses a body exactly as the server does (the same status
and error object), and forwards what the server accepts."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from servelab.route.app import RouterThread, build_route_app
from servelab.route.state import RouteConfig, RouteState
from servelab.serve.api import BODY_PARSERS, build_app
from sim.cluster.router import ROUTERS, RouterConfig
from tests.servelab.serve.helpers import health, start_server

MAX_BODY_BYTES = 1 << 20  # room for '[' * 200000


@pytest.fixture(scope="module")
def urls(tiny_model) -> Iterator[dict[str, str]]:
    """'serve': a tiny-model server; one router per policy in front of it, by name."""
    with start_server(tiny_model, max_body_bytes=MAX_BODY_BYTES) as server:
        routers = [RouterThread(RouteConfig((server.url,), RouterConfig(name), 0.05))
                   for name in ROUTERS]
        for router in routers:
            router.__enter__()
        try:
            yield {"serve": server.url} | {r.state.router.config.name: r.url for r in routers}
        finally:
            for router in routers:
                router.__exit__(None, None, None)


def post(url: str, raw: bytes, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(f"{url}{path}", content=raw, trust_env=False, timeout=60,
                      headers={"Content-Type": "application/json"})


def answers(urls: dict[str, str], raw: bytes, path: str = "/v1/completions"
            ) -> dict[str, tuple[int, dict]]:
    """(status, JSON body) of the same POST through the server and through every router."""
    result = {}
    for name, url in urls.items():
        response = post(url, raw, path)
        result[name] = (response.status_code, response.json())
    assert health(urls["serve"])["status"] == "ok"
    return result


def assert_refused_alike(urls: dict[str, str], raw: bytes, param: str | None,
                         path: str = "/v1/completions") -> str:
    """Every path answers the server's 400 naming `param`; its message."""
    got = answers(urls, raw, path)
    status, body = got["serve"]
    assert status == 400 and body["error"]["param"] == param, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert all(answer == (status, body) for answer in got.values()), got
    return body["error"]["message"]


# Reproduction 2: through route a lone surrogate and deep nesting raised (500).

def test_lone_surrogate_in_prompt_is_400_through_serve_and_every_router(urls):
    message = assert_refused_alike(urls, b'{"prompt": "\\ud800", "max_tokens": 2}', "prompt")
    assert "surrogate" in message


def test_lone_surrogate_in_chat_message_is_400_through_serve_and_every_router(urls):
    raw = b'{"messages": [{"role": "user", "content": "a\\udfffb"}], "max_tokens": 2}'
    message = assert_refused_alike(urls, raw, "messages", "/v1/chat/completions")
    assert "messages[0].content" in message


def test_deeply_nested_body_is_400_through_serve_and_every_router(urls):
    for raw in (b"[" * 200_000, b'{"prompt": ' + b"[" * 200_000):
        message = assert_refused_alike(urls, raw, None)
        assert "nested too deeply" in message


# Reproduction 3: an integer past int()'s 4,300 digits raised ValueError (500) on both.

HUGE = b"7" * 5000


@pytest.mark.parametrize(("raw", "param", "place"), [
    pytest.param(b'{"prompt": "hi", "frobnicate": ' + HUGE + b"}", "frobnicate", "frobnicate",
                 id="unknown-field"),
    pytest.param(b'{"prompt": "hi", "max_tokens": -' + HUGE + b"}", "max_tokens", "max_tokens",
                 id="max-tokens"),
    pytest.param(b'{"prompt": [1, 2, ' + HUGE + b"]}", "prompt", "prompt[2]", id="prompt-id"),
    pytest.param(b'{"prompt": "hi", "x": {"y": [' + HUGE + b"]}}", "x", "x.y[0]", id="nested"),
])
def test_integer_of_too_many_digits_is_400_naming_the_field(urls, raw, param, place):
    message = assert_refused_alike(urls, raw, param)
    assert message.startswith(f"{place}: an integer of 5000 digits")


@pytest.mark.parametrize(("raw", "param"), [
    pytest.param(b'{"prompt": "hi", "temperature": 1e999}', "temperature", id="overflow"),
    pytest.param(b'{"prompt": "hi", "top_p": -1e400}', "top_p", id="negative-overflow"),
    pytest.param(b'{"prompt": "hi", "extra": NaN}', "extra", id="nan-unknown-field"),
    pytest.param(b'{"prompt": "hi", "seed": Infinity}', "seed", id="infinity"),
    pytest.param(b'{"prompt": "hi", "": {"a": NaN}}', "", id="field-named-empty"),
    pytest.param(b'{"prompt": "hi", "priority": 18446744073709551616}', "priority",
                 id="priority-past-64-bits"),
    pytest.param(b'{"prompt": "hi", "top_k": 18446744073709551616}', "top_k",
                 id="top-k-past-64-bits"),
])
def test_number_no_field_can_hold_is_400_naming_the_field(urls, raw, param):
    assert_refused_alike(urls, raw, param)


def test_huge_number_in_a_chat_body_is_400_naming_the_field(urls):
    raw = b'{"messages": [{"role": "user", "content": "hi", "n": ' + HUGE + b"}]}"
    message = assert_refused_alike(urls, raw, "messages", "/v1/chat/completions")
    assert message.startswith("messages[0].n: an integer of 5000 digits")
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    assert_refused_alike(urls, raw, "temperature", "/v1/chat/completions")


# Reproduction 7: 0 < temperature < ~1e-38 returned the same token id every step.

@pytest.mark.parametrize("temperature", [1e-39, 5e-324, 1e-6])
def test_tiny_temperature_is_greedy_through_serve_and_every_router(urls, temperature):
    body = {"prompt": "The cat", "max_tokens": 12, "ignore_eos": True, "return_token_ids": True}
    greedy = post(urls["serve"], json.dumps({**body, "temperature": 0.0}).encode())
    greedy = greedy.json()["choices"][0]
    assert len(set(greedy["token_ids"])) > 1  # the failure this guards against: one id
    for name, url in urls.items():
        response = post(url, json.dumps({**body, "temperature": temperature}).encode())
        assert response.status_code == 200, (name, response.text)
        choice = response.json()["choices"][0]
        assert (choice["token_ids"], choice["text"]) == (greedy["token_ids"], greedy["text"])


# Reproduction 8: stream_options without stream: true was accepted (vLLM answers 400).

@pytest.mark.parametrize("stream", [{}, {"stream": False}])
def test_stream_options_without_streaming_is_400(urls, stream):
    options = {"stream_options": {"include_usage": True}, **stream}
    raw = json.dumps({"prompt": "hi", **options}).encode()
    assert_refused_alike(urls, raw, "stream_options")
    chat = json.dumps({"messages": [{"role": "user", "content": "hi"}], **options}).encode()
    assert_refused_alike(urls, chat, "stream_options", "/v1/chat/completions")


def test_stream_options_with_streaming_still_streams_the_usage(urls):
    raw = b'{"prompt": "hi", "max_tokens": 2, "stream": true, ' \
          b'"stream_options": {"include_usage": true}}'
    for name, url in urls.items():
        response = post(url, raw)
        assert response.status_code == 200, (name, response.text)
        events = [line for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and '"usage"' in events[-2], (name, events)


def test_a_body_the_parser_accepts_is_forwarded_unchanged_and_answered_upstream(urls):
    # The model name is the upstream's to check: the router forwards, the server's 404 comes
    # back as it was sent.
    got = answers(urls, b'{"prompt": "hi", "model": "gpt-9", "max_tokens": 1}')
    assert got["serve"][0] == 404 and got["serve"][1]["error"]["param"] == "model"
    assert all(answer == got["serve"] for answer in got.values()), got


def test_serve_and_route_post_exactly_the_paths_that_have_a_shared_body_parser(tiny_model):
    def post_paths(app) -> set[str]:
        return {r.path for r in app.routes if "POST" in getattr(r, "methods", ())}

    with start_server(tiny_model) as server:
        serve_app = build_app(server.state)
    route_app = build_route_app(RouteState.create(RouteConfig(("http://127.0.0.1:1",))))
    assert post_paths(serve_app) == post_paths(route_app) == set(BODY_PARSERS)
