"""Bad requests get the right 4xx with an OpenAI-style error object; the server stays healthy."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from sim.engine.core import BatchPlan, StepResult
from tests.servelab.serve.helpers import (
    HANG_S,
    MAX_MODEL_LEN,
    StepGate,
    async_client,
    health,
    start_server,
    wait_until,
)

BAD_BODIES = [
    pytest.param(b"{not json", 400, None, id="malformed-json"),
    pytest.param(b"[1, 2]", 400, None, id="not-an-object"),
    pytest.param(b'{"max_tokens": 4}', 400, "prompt", id="missing-prompt"),
    pytest.param(b'{"prompt": 12}', 400, "prompt", id="prompt-wrong-type"),
    pytest.param(b'{"prompt": [3, "a"]}', 400, "prompt", id="prompt-ids-wrong-type"),
    pytest.param(b'{"prompt": []}', 400, "prompt", id="prompt-empty-list"),
    pytest.param(b'{"prompt": ""}', 400, "prompt", id="prompt-empty-text"),
    pytest.param(b'{"prompt": [3, 99999]}', 400, "prompt", id="token-outside-vocab"),
    pytest.param(b'{"prompt": "hi", "max_tokens": "4"}', 400, "max_tokens", id="max-tokens-str"),
    pytest.param(b'{"prompt": "hi", "max_tokens": 2.5}', 400, "max_tokens", id="max-tokens-float"),
    pytest.param(b'{"prompt": "hi", "max_tokens": -3}', 400, "max_tokens", id="max-tokens-neg"),
    pytest.param(b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens", id="max-tokens-zero"),
    pytest.param(b'{"prompt": "hi", "max_tokens": 10000000000}', 400, "max_tokens",
                 id="max-tokens-huge"),
    pytest.param(json.dumps({"prompt": [5] * (MAX_MODEL_LEN + 1)}).encode(), 400, "prompt",
                 id="prompt-over-max-model-len"),
    pytest.param(b'{"prompt": "hi", "temperature": -1}', 400, "temperature", id="neg-temp"),
    pytest.param(b'{"prompt": "hi", "top_p": 0}', 400, "top_p", id="top-p-zero"),
    pytest.param(b'{"prompt": "hi", "stream": "yes"}', 400, "stream", id="stream-str"),
    pytest.param(b'{"prompt": "hi", "n": 2}', 400, "n", id="n-unsupported"),
    pytest.param(b'{"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}', 400, "stop",
                 id="five-stop-strings"),
    pytest.param(b'{"prompt": "hi", "model": "gpt-9"}', 404, "model", id="unknown-model"),
    pytest.param(b'{"prompt": "' + b"x" * 70_000 + b'"}', 413, None, id="body-too-large"),
]


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == param


@pytest.mark.parametrize(("raw", "status", "param"), BAD_BODIES)
def test_bad_body_gets_openai_error(server, raw, status, param):
    response = httpx.post(f"{server.url}/v1/completions", content=raw, trust_env=False,
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert_openai_error(response, status, param)
    assert health(server.url)["status"] == "ok"


def test_unknown_route_and_method_get_openai_errors(server):
    response = httpx.get(f"{server.url}/v1/nothing", trust_env=False, timeout=HANG_S)
    assert response.status_code == 404 and "error" in response.json()
    response = httpx.get(f"{server.url}/v1/completions", trust_env=False, timeout=HANG_S)
    assert response.status_code == 405 and "error" in response.json()


def test_api_key_required_on_v1_routes(tiny_model):
    body = {"prompt": [5, 6], "max_tokens": 2}
    with start_server(tiny_model, api_key="sekret") as server:
        url = f"{server.url}/v1/completions"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            response = httpx.post(url, json=body, headers=headers, trust_env=False, timeout=HANG_S)
            assert_openai_error(response, 401, None)
            assert response.json()["error"]["code"] == "invalid_api_key"
        models = httpx.get(f"{server.url}/v1/models", trust_env=False, timeout=HANG_S)
        assert models.status_code == 401
        good = {"Authorization": "Bearer sekret"}
        answer = httpx.post(url, json=body, headers=good, trust_env=False, timeout=HANG_S)
        assert answer.status_code == 200
        assert health(server.url)["status"] == "ok"  # /health needs no key


class PoisonBackend:
    """Raises on any step that holds a request whose prompt starts with token 300."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def execute(self, plan: BatchPlan) -> StepResult:
        if any(r.prompt_token_ids[0] == 300 for r in plan.requests):
            raise RuntimeError("injected failure")
        return self.inner.execute(plan)

    def free(self, request) -> None:
        self.inner.free(request)


def test_step_exception_fails_its_requests_and_server_keeps_serving(tiny_model):
    with start_server(tiny_model, wrap=PoisonBackend) as server:
        url = f"{server.url}/v1/completions"
        poison = {"prompt": [300, 4, 5], "max_tokens": 4}
        response = httpx.post(url, json=poison, trust_env=False, timeout=30)
        assert_openai_error(response, 500, None)
        assert "injected failure" in response.json()["error"]["message"]
        with httpx.stream("POST", url, json={**poison, "stream": True}, trust_env=False,
                          timeout=HANG_S) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert json.loads(lines[0][6:])["error"]["code"] == "failed"
        assert lines[-1] == "data: [DONE]"
        good = httpx.post(url, json={"prompt": [4, 5], "max_tokens": 3, "ignore_eos": True},
                          trust_env=False, timeout=30)
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 3
        state = health(server.url)
        assert state["status"] == "ok" and state["num_failed_steps"] == 2
        assert state["kv_blocks_used"] == 0


def test_full_waiting_queue_gets_503_with_retry_after(tiny_model):
    """Steps run only as the test allows them: the long request needs 240, so it still runs
    (and the second still waits) when the third arrives, however fast the model runs."""
    long = {"prompt": [9] * 8, "max_tokens": 240, "ignore_eos": True, "temperature": 0.0}
    before_end = long["max_tokens"] - 1

    async def main(url: str, gate: StepGate):
        async with async_client(url) as client:
            running = asyncio.create_task(client.post("/v1/completions", json=long))
            await until(url, gate, "num_running", 1, before_end)
            waiting = asyncio.create_task(client.post("/v1/completions", json=long))
            await until(url, gate, "num_waiting", 1, before_end)
            refused = await client.post("/v1/completions", json=long)
            running.cancel()
            waiting.cancel()
            await asyncio.gather(running, waiting, return_exceptions=True)
            return refused

    with StepGate() as gate, start_server(tiny_model, max_num_seqs=1, max_waiting=1,
                                          wrap=gate.wrap) as server:
        refused = asyncio.run(main(server.url, gate))
        assert_openai_error(refused, 503, None)
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "overloaded"
        gate.open()  # the cancelled clients' requests are aborted at the next iterations
        wait_until(lambda: health(server.url)["num_live"] == 0, "the cancelled are aborted")
        assert health(server.url)["kv_blocks_used"] == 0


async def until(url: str, gate: StepGate, key: str, value: int, max_steps: int) -> None:
    """Let steps run one at a time until /health shows key == value."""
    await asyncio.to_thread(gate.step_until, lambda: health(url)[key] == value, max_steps,
                            f"{key} == {value}")
