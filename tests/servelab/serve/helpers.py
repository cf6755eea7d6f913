"""Helpers for the serve tests: servers on free loopback ports, offline runs, stream readers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from executor.backend import ModelBackend
from servelab.serve.engine_thread import EngineThreadConfig
from servelab.serve.server import ServerThread, assemble
from servelab.serve.state import ApiConfig
from servelab.serve.tokenizer import ByteTokenizer
from sim.engine.core import Backend, BatchPlan, FinishReason, Request, SamplingParams, StepResult
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.speculation.config import SpeculativeConfig
from sim.engine.step import Engine

MODEL = "tiny"
MAX_MODEL_LEN = 256
BLOCK_SIZE = 16  # tokens per KV block of the test servers
# The read limit of the tests' HTTP calls: it only keeps a broken server from hanging the
# suite, so it must outlast any answer a loaded machine delays (httpx's own is 5 s).
HANG_S = 60.0


def start_server(model, *, policy: str = "continuous", num_blocks: int = 1024,
                 max_num_seqs: int = 256, api_key: str | None = None, max_waiting: int = 1024,
                 request_log: Path | None = None, max_body_bytes: int = 1 << 16,
                 wrap: Callable[[Backend], Backend] | None = None,
                 enable_prefix_caching: bool = True,
                 allowed_token_ids: tuple[int, ...] | None = None,
                 speculative: SpeculativeConfig | None = None) -> ServerThread:
    """A tiny-model server on a free 127.0.0.1 port (enter it to start)."""
    config = SchedulerConfig(policy=policy, num_blocks=num_blocks, block_size=BLOCK_SIZE,
                             max_num_seqs=max_num_seqs, max_model_len=MAX_MODEL_LEN,
                             enable_prefix_caching=enable_prefix_caching,
                             speculative=speculative)
    scheduler = Scheduler(config)
    backend: Backend = ModelBackend(model, scheduler.block_manager,
                                    allowed_token_ids=allowed_token_ids)
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
                             timeout=httpx.Timeout(HANG_S), **kwargs)


def health(url: str) -> dict:
    return httpx.get(f"{url}/health", trust_env=False, timeout=HANG_S).json()


def run(coro):
    return asyncio.run(coro)


def aborted(url: str, reason: str = "aborted") -> float:
    """vllm:request_success_total{finished_reason=reason} from /metrics."""
    text = httpx.get(f"{url}/metrics", trust_env=False, timeout=HANG_S).text
    for line in text.splitlines():
        if (line.startswith("vllm:request_success_total")
                and f'finished_reason="{reason}"' in line):
            return float(line.split()[-1])
    return 0.0


def wait_until(done: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll until done(); the timeout only stops a hung test, it decides no outcome."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"{what}: still not so after {timeout_s} s"
        time.sleep(0.01)


class StepGate:
    """A backend wrapper whose every step waits for a permit the test hands out.

    Between permits the server stands still, however fast the machine: a request that needs
    N more steps cannot finish until the test has allowed N. Pass `gate.wrap` as
    start_server's `wrap`; leaving the `with gate:` block opens it so the server can stop.
    """

    def __init__(self, wait_s: float = 60.0) -> None:
        self.backend: Backend | None = None
        self.allowed = 0  # permits handed out so far
        self._wait_s = wait_s  # a step waiting this long fails (a hung test, not an outcome)
        self._permits = 0
        self._open = False
        self._cond = threading.Condition()

    def wrap(self, backend: Backend) -> StepGate:
        self.backend = backend
        return self

    def execute(self, plan: BatchPlan) -> StepResult:
        with self._cond:
            if not self._cond.wait_for(lambda: self._open or self._permits > 0, self._wait_s):
                raise TimeoutError(f"step gate: no permit within {self._wait_s} s")
            if not self._open:
                self._permits -= 1
        return self.backend.execute(plan)

    def free(self, request: Request) -> None:
        self.backend.free(request)

    def open(self) -> None:
        """Let every step run from now on."""
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def step_until(self, done: Callable[[], bool], max_steps: int, what: str) -> None:
        """Hand out one step at a time (the next once the last is taken) until done();
        fail if done() needs more than max_steps permits in all."""
        deadline = time.monotonic() + self._wait_s
        while not done():
            assert time.monotonic() < deadline, f"{what}: still not so after {self._wait_s} s"
            with self._cond:
                if self._permits == 0:
                    assert self.allowed < max_steps, f"{what}: not so after {max_steps} steps"
                    self._permits, self.allowed = 1, self.allowed + 1
                    self._cond.notify_all()
            # 50 ms a step: what done() waits on (a disconnect noticed, say) gets seconds
            # before max_steps run out, while a test needs only a handful of steps.
            time.sleep(0.05)

    def __enter__(self) -> StepGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.open()


class PacedBackend:
    """A backend wrapper whose steps each take at least step_s of wall time: races between
    the engine and the HTTP side are run against a set duration, not the machine's speed."""

    def __init__(self, backend: Backend, step_s: float) -> None:
        self.backend = backend
        self.step_s = step_s

    def execute(self, plan: BatchPlan) -> StepResult:
        start_s = time.monotonic()
        result = self.backend.execute(plan)
        time.sleep(max(0.0, self.step_s - (time.monotonic() - start_s)))
        return StepResult(time.monotonic() - start_s, result.sampled_token_ids)

    def free(self, request: Request) -> None:
        self.backend.free(request)
