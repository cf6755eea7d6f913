"""Streaming: the same tokens as the offline engine, 200 clients at once, disconnects."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from sim.engine.scheduler_config import SchedulerConfig
from tests.servelab.serve.helpers import (
    HANG_S,
    MAX_MODEL_LEN,
    StepGate,
    aborted,
    async_client,
    health,
    offline_outputs,
    run,
    start_server,
    stream_completion,
    wait_until,
)
from workloads.formats.sqlite import TABLE


def seeded_bodies(count: int) -> list[dict]:
    """Token-id prompts of varied lengths; greedy and sampled; EOS honoured or ignored."""
    bodies = []
    for i in range(count):
        prompt = [3 + (i * 37 + j * 11) % 250 for j in range(3 + (i * 7) % 40)]
        body = {"prompt": prompt, "max_tokens": 4 + (i * 5) % 24, "seed": 1000 + i,
                "ignore_eos": i % 2 == 0}
        if i % 3 == 0:
            body["temperature"] = 0.0
        else:
            body.update(temperature=0.9, top_k=40 if i % 3 == 1 else 0, top_p=0.95)
        bodies.append(body)
    return bodies


def logged_arrivals(path: Path) -> int:
    """Requests the server has queued for its engine: each is in its request log one commit
    after it arrives, whether or not the engine has stepped since."""
    with closing(sqlite3.connect(path)) as db:
        return db.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()[0]


@pytest.mark.parametrize(("policy", "num_blocks"), [("continuous", 1024), ("recompute", 12)])
def test_streamed_tokens_equal_offline_engine(tiny_model, tmp_path, policy, num_blocks):
    """Recompute with 12 blocks preempts: outputs must still match the offline run. No step
    runs until every request is queued for the engine (the first step may have taken a few),
    so they contend for the pool however fast the machine serves the first ones."""
    bodies = seeded_bodies(12)
    config = SchedulerConfig(policy=policy, num_blocks=num_blocks, block_size=16,
                             max_model_len=MAX_MODEL_LEN)
    expected = offline_outputs(tiny_model, bodies, config)
    log = tmp_path / "requests.sqlite"

    async def main(url: str, gate: StepGate):
        async with async_client(url) as client:
            tasks = [asyncio.create_task(stream_completion(client, b)) for b in bodies]
            await asyncio.to_thread(wait_until, lambda: logged_arrivals(log) >= len(bodies),
                                    "every request is queued for the engine")
            gate.open()
            return await asyncio.gather(*tasks)

    with StepGate() as gate, start_server(tiny_model, policy=policy, num_blocks=num_blocks,
                                          wrap=gate.wrap, request_log=log) as server:
        results = run(main(server.url, gate))
        metrics = httpx.get(f"{server.url}/metrics", trust_env=False, timeout=HANG_S).text
        assert health(server.url)["kv_blocks_used"] == 0
    for (ids, last), body, want in zip(results, bodies, expected, strict=True):
        assert ids == want
        usage = last["usage"]
        # Every prompt starts with its own token, so none shares a cached block.
        assert usage == {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(want),
                         "total_tokens": len(body["prompt"]) + len(want),
                         "prompt_tokens_details": {"cached_tokens": 0}}
        finish = "length" if len(want) == body["max_tokens"] else "stop"
        assert last["choices"][0]["finish_reason"] == finish
    if policy == "recompute":
        line = next(x for x in metrics.splitlines() if x.startswith("vllm:num_preemptions_total"))
        assert float(line.split()[-1]) > 0


def test_non_streamed_response_carries_usage_and_text(server):
    body = {"prompt": "Hello, servelab", "max_tokens": 6, "temperature": 0.0, "seed": 1,
            "ignore_eos": True, "return_token_ids": True}
    response = httpx.post(f"{server.url}/v1/completions", json=body, trust_env=False, timeout=30)
    assert response.status_code == 200
    data = response.json()
    choice = data["choices"][0]
    assert data["object"] == "text_completion" and data["model"] == "tiny"
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 6
    assert data["usage"] == {"prompt_tokens": 15, "completion_tokens": 6, "total_tokens": 21,
                             "prompt_tokens_details": {"cached_tokens": 0}}  # < one block
    assert isinstance(choice["text"], str)


def test_200_concurrent_streams_all_complete_and_free_every_block(server):
    bodies = [{"prompt": [3 + (i + j) % 200 for j in range(4 + i % 9)],
               "max_tokens": 3 + i % 6, "temperature": 0.0, "ignore_eos": True}
              for i in range(200)]

    async def main():
        async with async_client(server.url) as client:
            return await asyncio.gather(*(stream_completion(client, b) for b in bodies))

    results = run(main())
    assert len(results) == 200
    for (ids, last), body in zip(results, bodies, strict=True):
        assert len(ids) == body["max_tokens"]
        assert last["usage"]["completion_tokens"] == body["max_tokens"]
    state = health(server.url)
    assert state["status"] == "ok" and state["num_live"] == 0
    assert state["kv_blocks_used"] == 0 and state["num_running"] == 0


def test_client_disconnect_aborts_and_frees_blocks_others_unaffected(tiny_model):
    """Steps run only as the test allows them: the leaver needs 230, so an abort seen after
    fewer came from its disconnect, however fast the model runs."""
    others = [{"prompt": [10 + i] * 8, "max_tokens": 48, "temperature": 0.0, "ignore_eos": True}
              for i in range(3)]
    leaver = {"prompt": [42] * 20, "max_tokens": 230, "temperature": 0.0, "ignore_eos": True,
              "stream": True, "return_token_ids": True}
    before_end = leaver["max_tokens"] - 1  # steps after which the leaver could be done
    left = threading.Event()

    async def leave_after_three(client):
        got = 0
        async with client.stream("POST", "/v1/completions", json=leaver) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    got += len(json.loads(line[6:])["choices"][0]["token_ids"])
                if got >= 3:
                    break  # leaving the block closes the connection mid-stream
        left.set()

    async def main(url, gate):
        async with async_client(url) as client:
            tasks = [asyncio.create_task(stream_completion(client, b)) for b in others]
            await asyncio.gather(leave_after_three(client), asyncio.to_thread(
                gate.step_until, left.is_set, before_end, "the leaver has three tokens"))
            # Stats are published after each step: the one after the abort shows it gone.
            await asyncio.to_thread(
                gate.step_until,
                lambda: aborted(url) >= 1 and health(url)["num_live"] <= len(others),
                before_end, "the leaver is aborted and no longer live")
            gate.open()
            return await asyncio.gather(*tasks)

    with StepGate() as gate, start_server(tiny_model, wrap=gate.wrap) as server:
        results = run(main(server.url, gate))
        state = health(server.url)
    for (ids, last), body in zip(results, others, strict=True):
        assert len(ids) == body["max_tokens"] and last["choices"][0]["finish_reason"] == "length"
    assert state["kv_blocks_used"] == 0 and state["num_live"] == 0


def test_non_streamed_client_that_times_out_is_aborted(tiny_model):
    """No step runs until the client has given up, so its timeout always fires first; the
    request needs 240 steps, so an abort seen after fewer came from the disconnect."""
    body = {"prompt": [7] * 10, "max_tokens": 240, "temperature": 0.0, "ignore_eos": True}
    with StepGate() as gate, start_server(tiny_model, wrap=gate.wrap) as server:
        before = aborted(server.url)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/completions", json=body, trust_env=False, timeout=0.2)
        gate.step_until(lambda: (aborted(server.url) > before
                                 and health(server.url)["kv_blocks_used"] == 0),
                        body["max_tokens"] - 1, "the abandoned request is aborted and freed")
