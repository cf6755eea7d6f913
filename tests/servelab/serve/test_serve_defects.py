"""Inputs that used to crash a handler: each now gets a clear 4xx, or a 500 that keeps the link."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import httpx
import pytest

import servelab.serve.completions
from servelab.serve.state import ApiConfig
from tests.servelab.serve.helpers import HANG_S, health, start_server

PROMPT = {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0.0}


def post(url: str, raw: bytes, headers: dict | None = None) -> httpx.Response:
    headers = {"Content-Type": "application/json", **(headers or {})}
    return httpx.post(f"{url}/v1/completions", content=raw, headers=headers, trust_env=False,
                      timeout=30)


def test_lone_surrogate_in_prompt_is_a_400_not_a_500(server):
    response = post(server.url, b'{"prompt": "ab\\udcff", "max_tokens": 2}')
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "prompt" and "surrogate" in error["message"]
    assert health(server.url)["status"] == "ok"


@pytest.mark.parametrize("field", ["stop", "user"])
def test_lone_surrogate_in_other_text_fields_is_a_400(server, field):
    body = b'{"prompt": "ab", "max_tokens": 2, "%s": "x\\ud800"}' % field.encode()
    response = post(server.url, body)
    assert response.status_code == 400 and response.json()["error"]["param"] == field


def test_deeply_nested_json_is_a_400_not_a_500(tiny_model):
    with start_server(tiny_model, max_body_bytes=1 << 20) as server:
        response = post(server.url, b"[" * 200_000)
        assert response.status_code == 400, response.text
        assert "nested too deeply" in response.json()["error"]["message"]
        assert health(server.url)["status"] == "ok"


def test_non_ascii_bearer_token_is_a_401_not_a_500(tiny_model):
    with start_server(tiny_model, api_key="sekret") as server:
        for token in ("Bearer clé".encode(), "Bearer Ω".encode(), b"Bearer \xff\xfe"):
            response = post(server.url, json.dumps(PROMPT).encode(), {"Authorization": token})
            assert response.status_code == 401, response.text
            assert response.json()["error"]["code"] == "invalid_api_key"
        good = post(server.url, json.dumps(PROMPT).encode(), {"Authorization": "Bearer sekret"})
        assert good.status_code == 200


def test_non_ascii_api_key_is_compared_as_utf8_bytes(tiny_model):
    with start_server(tiny_model, api_key="clé-ключ-voilà") as server:
        raw = json.dumps(PROMPT).encode()
        for token, status in (("Bearer clé-ключ-voilà".encode(), 200), (b"Bearer sekret", 401),
                              ("Bearer clé-ключ-voila".encode(), 401), (b"Bearer cl\xe9", 401)):
            assert post(server.url, raw, {"Authorization": token}).status_code == status
        models = httpx.get(f"{server.url}/v1/models", trust_env=False,
                           headers={"Authorization": "Bearer clé-ключ-voilà".encode()},
                           timeout=HANG_S)
        assert models.status_code == 200


@pytest.mark.parametrize("key", ["line\nbreak", "tab\there", " padded", "padded ", "nul\x00",
                                 "del\x7f", "nbsp\u00a0", "half\udcff"])
def test_api_key_that_cannot_travel_in_a_header_is_refused_at_startup(key):
    with pytest.raises(ValueError, match="api_key"):
        ApiConfig("m", 64, api_key=key)


def test_unexpected_error_is_a_json_500_and_the_connection_stays_usable(server, monkeypatch):
    def explode(*args, **kwargs):
        raise RuntimeError("injected handler bug")

    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    headers = {"Content-Type": "application/json"}
    try:
        with monkeypatch.context() as patch:
            patch.setattr(servelab.serve.completions, "check_lengths", explode)
            conn.request("POST", "/v1/completions", json.dumps(PROMPT), headers)
            failed = conn.getresponse()
            body = json.loads(failed.read())
        assert failed.status == 500 and body["error"]["type"] == "server_error"
        assert "RuntimeError" in body["error"]["message"]
        assert (failed.getheader("connection") or "").lower() != "close"
        sock = conn.sock
        conn.request("POST", "/v1/completions", json.dumps(PROMPT), headers)  # same socket
        ok = conn.getresponse()
        assert ok.status == 200 and json.loads(ok.read())["usage"]["completion_tokens"] >= 1
        assert conn.sock is sock
    finally:
        conn.close()
    assert health(server.url)["num_live"] == 0
