"""Generated hostile bodies and headers, thrown at a tiny-model server and at a router in front
of it: never a 5xx, every refusal an OpenAI error object (naming the field when the body was
a JSON object), the router refusing exactly as the server does, and the engine still serving
a plain request after each one."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servelab.route.app import RouterThread
from servelab.route.state import RouteConfig
from sim.cluster.router import RouterConfig
from tests.servelab.serve.helpers import start_server

PATHS = ("/v1/completions", "/v1/chat/completions")
FIELDS = ("prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
          "top_k", "seed", "stream", "stream_options", "stop", "stop_token_ids", "priority",
          "user", "model", "n", "echo", "logprobs", "tools", "ignore_eos", "return_token_ids")
# Numbers Python's json reads into something no field can hold, or barely can.
NUMBERS = ("1e999", "-1e999", "NaN", "Infinity", "-Infinity", "7" * 4301, "-" + "9" * 5000,
           "1e-400", "5e-324", "1e-39", "18446744073709551616", "-9223372036854775809",
           "9223372036854775807", "-0", "0.0", "1e308", "2.5", "4", "1", "0", "-1")

# Text with anything a JSON string can escape: lone surrogates, NUL, controls, non-BMP.
text = st.text(st.characters(exclude_categories=()), max_size=12)
scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | text
           | st.floats(allow_nan=False, allow_infinity=False))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(text, inner, max_size=3), max_leaves=8)


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


fragments = st.one_of(
    values.map(json.dumps),  # ensure_ascii: a lone surrogate goes out as \\udXXX
    st.sampled_from(NUMBERS),
    st.integers(1, 400).map(nested),
    st.lists(st.integers(-5, 300) | st.sampled_from([2**63, -(2**63) - 1]), min_size=1,
             max_size=6).map(json.dumps),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "tool", "bot"]) | text,
                           "content": text | values}).map(lambda m: json.dumps([m])),
    st.fixed_dictionaries({}, optional={"include_usage": values}).map(json.dumps),
)


@st.composite
def object_bodies(draw) -> bytes:
    """A JSON object of known and unknown fields with hostile values, written as raw text."""
    fields = draw(st.dictionaries(st.sampled_from(FIELDS) | text, fragments, max_size=6))
    # Enough valid fields now and then to reach the engine; max_tokens stays small unless
    # generated.
    if draw(st.booleans()):
        fields.setdefault("prompt", json.dumps("hi"))
        fields.setdefault("messages", json.dumps([{"role": "user", "content": "hi"}]))
    fields.setdefault("max_tokens", "2")
    return ("{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in fields.items()) + "}").encode()


# Bodies that pass the parser with edge values the engine must take: subnormal temperatures,
# any top_k / seed / priority that fits, odd Unicode in prompts and stop strings.
sampling = st.fixed_dictionaries({}, optional={
    "temperature": st.floats(0.0, 3.0) | st.sampled_from([5e-324, 1e-39, 1e-6, 1e-5]),
    "top_p": st.floats(1e-300, 1.0, exclude_min=False),
    "top_k": st.integers(-1, 2**63 - 1),
    "seed": st.integers(0, 2**63 - 1),
    "priority": st.integers(-(2**63), 2**63 - 1),
    "stop": st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=4), max_size=4),
    "stream": st.booleans(),
    "ignore_eos": st.booleans(),
    "return_token_ids": st.booleans(),
})
prompts = (st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)
           | st.lists(st.integers(0, 255), min_size=1, max_size=40))
near_valid_bodies = st.builds(
    lambda prompt, params, max_tokens: json.dumps(
        {"prompt": prompt, "messages": [{"role": "user", "content": str(prompt)}],
         "max_tokens": max_tokens, **params}).encode(),
    prompts, sampling, st.integers(1, 4))
junk_bodies = st.binary(max_size=48) | st.sampled_from(
    [b"", b"[" * 5000, b'{"prompt": "\\ud800"', b"null", b"[1e999]", b'"\\udcff"', b"\xff\xfe"])
# Header values as h11 lets a client send them: visible ASCII and any high byte.
header_values = st.binary(max_size=16).map(
    lambda b: bytes(c for c in b if c > 0x20 and c != 0x7F))
headers = st.dictionaries(st.sampled_from(["x-tenant", "content-type", "authorization", "accept",
                                           "user-agent", "x-request-id", "x-other"]),
                          header_values, max_size=4)


@pytest.fixture(scope="module")
def urls(tiny_model, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """A tiny-model server logging requests (where tenants land), and a prefix-aware router
    (the policy that reads the most of a body) in front of it."""
    log = tmp_path_factory.mktemp("hostile") / "requests.sqlite"
    with start_server(tiny_model, request_log=log) as server, RouterThread(
            RouteConfig((server.url,), RouterConfig("prefix-aware"), 0.05)) as router:
        yield server.url, router.url


def check_answer(response: httpx.Response, was_object: bool) -> None:
    assert response.status_code < 500, response.text
    if response.status_code == 200:
        if response.headers["content-type"].startswith("text/event-stream"):
            assert response.text.rstrip().endswith("data: [DONE]"), response.text
        return
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if was_object and response.status_code in (400, 404):
        assert isinstance(error["param"], str), error  # "" only for a field named ""


def still_serves(client: httpx.Client, url: str) -> None:
    response = client.post(f"{url}/v1/completions", json={"prompt": "ok", "max_tokens": 1})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 1


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(PATHS), object_bodies() | near_valid_bodies | junk_bodies, headers)
def test_hostile_bodies_and_headers_never_get_a_5xx(urls, path, raw, sent_headers):
    was_object = raw.startswith(b"{") and raw.endswith(b"}") and len(raw) > 2
    with httpx.Client(trust_env=False, timeout=60) as client:
        answers = []
        for url in urls:
            response = client.post(f"{url}{path}", content=raw, headers=sent_headers)
            check_answer(response, was_object)
            answers.append(response)
            still_serves(client, url)
    served, routed = answers
    event(f"{path} answered {served.status_code}")  # --hypothesis-show-statistics: the mix
    assert served.status_code == routed.status_code, (served.text, routed.text)
    if served.status_code != 200:  # one parser: the router's refusal is the server's
        assert served.json() == routed.json()
