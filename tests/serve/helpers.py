"""Helpers for the serve tests: servers on free loopback ports, offline runs, stream readers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx

from executor.backend import ModelBackend
from serve.engine_thread import EngineThreadConfig
from serve.server import ServerThread, assemble
from serve.state import ApiConfig
from serve.tokenizer import ByteTokenizer
from sim.core import Backend, FinishReason, Request, SamplingParams
from sim.engine import Engine
from sim.scheduler import Scheduler, SchedulerConfig

MODEL = "tiny"
MAX_MODEL_LEN = 256
BLOCK_SIZE = 16  # tokens per KV block of the test servers


def start_server(model, *, policy: str = "continuous", num_blocks: int = 1024,
                 max_num_seqs: int = 256, api_key: str | None = None, max_waiting: int = 1024,
                 request_log: Path | None = None, max_body_bytes: int = 1 << 16,
                 wrap: Callable[[Backend], Backend] | None = None,
                 enable_prefix_caching: bool = True) -> ServerThread:
    """A tiny-model server on a free 127.0.0.1 port (enter it to start)."""
    config = SchedulerConfig(policy=policy, num_blocks=num_blocks, block_size=BLOCK_SIZE,
                             max_num_seqs=max_num_seqs, max_model_len=MAX_MODEL_LEN,
                             enable_prefix_caching=enable_prefix_caching)
    scheduler = Scheduler(config)
    backend: Backend = ModelBackend(model, scheduler.block_manager)
    if wrap is not None:
        backend = wrap(backend)
    api = ApiConfig(MODEL, MAX_MODEL_LEN, api_key, max_body_bytes)
    state = assemble(scheduler, backend, ByteTokenizer(), model.args.vocab_size, api,
                     EngineThreadConfig(max_waiting), request_log)
    return ServerThread(state)


def sampling_of(body: dict) -> SamplingParams:
    """The SamplingParams the server builds for a body (byte tokenizer: EOS is 2)."""
    stops = tuple(body.get("stop_token_ids", ()))
    ignore_eos = body.get("ignore_eos", False)
    return SamplingParams(
        temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
        top_k=max(body.get("top_k", 0), 0), seed=body["seed"],
        stop_token_ids=stops if ignore_eos else (2, *stops), ignore_eos=ignore_eos)


def offline_outputs(model, bodies: list[dict], config: SchedulerConfig) -> list[list[int]]:
    """Token ids of the same requests run offline: Scheduler + ModelBackend, a plain loop."""
    scheduler = Scheduler(config)
    engine = Engine(scheduler, ModelBackend(model, scheduler.block_manager))
    requests = [Request(str(i), 0.0, len(b["prompt"]), b["max_tokens"], list(b["prompt"]),
                        sampling_of(b)) for i, b in enumerate(bodies)]
    for request in requests:
        assert engine.add(request)
    while scheduler.has_unfinished:
        plan = engine.schedule(0.0)
        result = engine.execute(plan)
        engine.finish_step(plan, result, 0.0)
    assert all(r.finish_reason in (FinishReason.LENGTH, FinishReason.STOP) for r in requests)
    return [r.output_token_ids for r in requests]


async def stream_completion(client: httpx.AsyncClient, body: dict) -> tuple[list[int], dict]:
    """POST a streamed completion; the token ids and the last chunk (finish, usage)."""
    ids: list[int] = []
    last: dict = {}
    payload = {**body, "stream": True, "return_token_ids": True}
    async with client.stream("POST", "/v1/completions", json=payload) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            ids.extend(chunk["choices"][0]["token_ids"])
            last = chunk
    return ids, last


def async_client(url: str, **kwargs) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=url, trust_env=False, limits=limits,
                             timeout=httpx.Timeout(60.0), **kwargs)


def health(url: str) -> dict:
    return httpx.get(f"{url}/health", trust_env=False, timeout=10).json()


def run(coro):
    return asyncio.run(coro)


def aborted(url: str, reason: str = "aborted") -> float:
    """vllm:request_success_total{finished_reason=reason} from /metrics."""
    text = httpx.get(f"{url}/metrics", trust_env=False, timeout=10).text
    for line in text.splitlines():
        if (line.startswith("vllm:request_success_total")
                and f'finished_reason="{reason}"' in line):
            return float(line.split()[-1])
    return 0.0
