"""vLLM's POST /tokenize and /detokenize: the server's tokenizer, and 400 for bad bodies."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from servelab.serve.api import build_app
from servelab.serve.server import assemble
from servelab.serve.state import ApiConfig
from servelab.serve.tokenize_api import add_tokenize_routes
from servelab.serve.tokenizer import ByteTokenizer, plain_chat_prompt
from sim.cost.fixed_backend import ConstantBackend
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig

MAX_MODEL_LEN = 64


@pytest.fixture
def client() -> TestClient:
    scheduler = Scheduler(SchedulerConfig(num_blocks=8, max_model_len=MAX_MODEL_LEN))
    state = assemble(scheduler, ConstantBackend(), ByteTokenizer(), 300,
                     ApiConfig("m", MAX_MODEL_LEN, api_key="k"))
    app = add_tokenize_routes(build_app(state), state)
    return TestClient(app, headers={"Authorization": "Bearer k"})


def test_tokenize_a_prompt_gives_its_ids_count_and_max_model_len(client: TestClient):
    response = client.post("/tokenize", json={"model": "m", "prompt": "héllo"})
    assert response.status_code == 200
    body = response.json()
    assert body["tokens"] == ByteTokenizer().encode("héllo")
    assert body["count"] == 6 and body["max_model_len"] == MAX_MODEL_LEN


def test_tokenize_messages_uses_the_chat_prompt(client: TestClient):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    body = client.post("/tokenize", json={"messages": messages}).json()
    assert body["tokens"] == ByteTokenizer().encode(plain_chat_prompt(messages))


def test_detokenize_round_trips_tokenize(client: TestClient):
    tokens = client.post("/tokenize", json={"prompt": "a ünïcode text"}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": tokens}).json() == {
        "prompt": "a ünïcode text"}


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/tokenize", {}, "exactly one"),
        ("/tokenize", {"prompt": "a", "messages": []}, "exactly one"),
        ("/tokenize", {"prompt": [1, 2]}, "prompt"),
        ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0]"),
        ("/tokenize", {"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ("/tokenize", [1], "JSON object"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/detokenize", {"tokens": [5, 300]}, "tokens[1]"),
        ("/detokenize", {"tokens": [5, -1]}, "tokens[1]"),
        ("/detokenize", {"tokens": [5, True]}, "tokens[1]"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(client: TestClient, path: str, body, words: str):
    response = client.post(path, json=body)
    assert response.status_code == 400
    assert words in response.json()["error"]["message"]


def test_a_body_that_is_not_json_is_a_400(client: TestClient):
    response = client.post("/tokenize", content=b"{nope")
    assert response.status_code == 400 and "not JSON" in response.json()["error"]["message"]


def test_the_api_key_guards_tokenize(client: TestClient):
    response = client.post("/tokenize", json={"prompt": "a"}, headers={"Authorization": ""})
    assert response.status_code == 401
