"""The trace-replay load client: send each request at its trace time, time every streamed token.

Like `vllm bench serve`: prompts are token ids (synthesized for traces that only carry
lengths), max_tokens is the trace's output length, EOS is ignored, every response streams.
Each request becomes a sim.core.Request stamped with client-side times (send, every token,
last token), so sim.metrics.summarize computes the same keys as the simulator.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from executor.prompts import synth_prompt_tokens
from serve.connection import BenchConfig, make_client, post_once_more_if_unsent
from sim.core import FinishReason, Request
from sim.metrics import Slo, summarize
from sim.simulation import RunResult
from workloads.trace import Trace

# Step-level keys of sim.metrics.summarize that a client cannot observe.
_SERVER_SIDE_KEYS = ("num_steps", "mean_batch_size", "max_batch_size", "mean_kv_usage",
                     "slot_utilization")
_FINISH = {"length": FinishReason.LENGTH, "stop": FinishReason.STOP,
           "abort": FinishReason.ABORTED}


@dataclass(frozen=True)
class BenchRequest:
    """One request to send: when (seconds from the run's start) and what."""

    request_id: str
    arrival_s: float
    prompt_token_ids: list[int]
    max_tokens: int
    tenant: str | None = None  # sent as the body's `user`


@dataclass
class BenchResult:
    """Every request as the client saw it, the errors, server preemptions if scraped, and
    how many requests were sent again after a first try that never reached the server."""

    requests: list[Request]
    errors: list[str] = field(default_factory=list)
    preemptions: int | None = None
    retried: int = 0


def bench_requests(trace: Trace, vocab_size: int, seed: int = 0) -> list[BenchRequest]:
    """The trace's requests with synthetic prompts (equal prefix hash ids share tokens)."""
    table = trace.table
    hashes = table["prefix_hash_ids"].tolist() if trace.has_prefix_hashes else None
    tenants = table["tenant"].tolist() if "tenant" in table.columns else None
    out = []
    for i, (rid, arrival, prompt_len, output_len) in enumerate(zip(
            trace.request_ids, trace.arrival_s.tolist(), trace.prompt_len.tolist(),
            trace.output_len.tolist(), strict=True)):
        ids = synth_prompt_tokens(f"{seed}:{rid}", prompt_len, vocab_size,
                                  hashes[i] if hashes else None)
        out.append(BenchRequest(rid, arrival, ids, output_len, tenants[i] if tenants else None))
    return out


async def replay_trace(trace: Trace, config: BenchConfig, vocab_size: int | None = None,
                       seed: int = 0, on_done: Callable[[], None] | None = None
                       ) -> tuple[str, int, BenchResult]:
    """Ask the server for its model (and vocab, unless given), then replay the trace: the
    model id, the vocab size the prompts were drawn from, and the result."""
    async with make_client(config) as client:
        card = await model_card(client, config.model)
    vocab = vocab_size or card.get("vocab_size")
    if not vocab:
        raise ValueError(f"{config.url} does not report its vocab size; pass --vocab-size")
    result = await run_bench(bench_requests(trace, int(vocab), seed), config, on_done)
    return card["id"], int(vocab), result


async def model_card(client: aiohttp.ClientSession, model: str | None) -> dict:
    """The server's card for `model` (or its first), from GET /v1/models."""
    async with client.get("v1/models") as response:
        if response.status != 200:
            text = (await response.text())[:200]
            raise ValueError(f"GET /v1/models: HTTP {response.status}: {text}")
        cards = (await response.json()).get("data") or []
    for card in cards:
        if model is None or card.get("id") == model:
            return card
    raise ValueError(f"the server does not serve model {model!r}")


async def scrape_preemptions(client: aiohttp.ClientSession) -> int | None:
    """vllm:num_preemptions_total from /metrics, or None if the server exposes none."""
    try:
        async with client.get("metrics") as response:
            if response.status != 200:
                return None
            text = await response.text()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None
    total = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:num_preemptions_total":
                total = (total or 0) + int(sample.value)
    return total


async def run_bench(requests: list[BenchRequest], config: BenchConfig,
                    on_done: Callable[[], None] | None = None) -> BenchResult:
    """Send every request at its time; stop waiting after config.timeout_s.

    `on_done` is called as each request ends (a progress bar).
    """
    async with make_client(config) as client, make_client(config, pooled=False) as fresh:
        model = (await model_card(client, config.model))["id"]
        before = await scrape_preemptions(client)
        records = [Request(r.request_id, r.arrival_s, len(r.prompt_token_ids), r.max_tokens,
                           list(r.prompt_token_ids)) for r in requests]
        run = _Run(client, fresh, model, asyncio.Semaphore(config.max_concurrency
                                                           or len(requests) or 1))
        tasks = [asyncio.create_task(_send(run, r, rec)) for r, rec in
                 zip(requests, records, strict=True)]
        if on_done is not None:
            for task in tasks:
                task.add_done_callback(lambda _: on_done())
        _, pending = await asyncio.wait(tasks, timeout=config.timeout_s) if tasks else ((), ())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for record in records:
            if record.finish_reason is None:
                _fail(record, run.errors, f"unfinished after the {config.timeout_s} s time limit")
        after = await scrape_preemptions(client)
    preemptions = after - before if before is not None and after is not None else None
    return BenchResult(records, run.errors, preemptions, run.retried)


@dataclass
class _Run:
    """What every request of one run shares: the sessions, the gate, the clock, the tallies."""

    client: aiohttp.ClientSession
    fresh: aiohttp.ClientSession  # new connections only, for the second tries
    model: str
    gate: asyncio.Semaphore
    t0: float = field(default_factory=time.perf_counter)
    errors: list[str] = field(default_factory=list)
    retried: int = 0


async def _send(run: _Run, sent: BenchRequest, record: Request) -> None:
    delay = run.t0 + sent.arrival_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    async with run.gate:
        payload = {"model": run.model, "prompt": sent.prompt_token_ids,
                   "max_tokens": sent.max_tokens, "temperature": 0.0, "ignore_eos": True,
                   "stream": True, "return_token_ids": True}
        if sent.tenant is not None:
            payload["user"] = sent.tenant
        record.arrival_s = time.perf_counter() - run.t0  # TTFT counts from the actual send
        try:
            response, again = await post_once_more_if_unsent(run.client, run.fresh,
                                                             "v1/completions", payload)
            run.retried += again
            async with response:
                if response.status != 200:
                    text = (await response.text(errors="replace"))[:200]
                    _fail(record, run.errors, f"HTTP {response.status}: {text}",
                          FinishReason.REJECTED if response.status == 400 else None)
                    return
                await _read_stream(response, record, run.t0, run.errors)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
            _fail(record, run.errors, f"{type(exc).__name__}: {exc}")


async def _read_stream(response: aiohttp.ClientResponse, record: Request, t0: float,
                       errors: list[str]) -> None:
    """Server-sent events, split by hand: each network read is stamped once."""
    pending = b""
    async for data in response.content.iter_any():
        now = time.perf_counter() - t0
        *events, pending = (pending + data).replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            if event.startswith(b"data: [DONE]"):
                return _finish_stream(record, errors)
            if event.startswith(b"data: ") and not _take_chunk(record, event[6:], now, errors):
                return None
    return _finish_stream(record, errors)


def _take_chunk(record: Request, data: bytes, now: float, errors: list[str]) -> bool:
    """Record one chunk's tokens; False after an error event."""
    chunk = json.loads(data)
    if "error" in chunk:
        _fail(record, errors, f"stream error: {chunk['error'].get('message')}")
        return False
    choice = chunk["choices"][0]
    ids = choice.get("token_ids")
    count = len(ids) if ids is not None else int(bool(choice.get("text")))
    record.output_token_ids.extend(ids or [])
    record.token_times_s.extend([now] * count)
    if choice.get("finish_reason") is not None:
        record.finish_reason = _FINISH.get(choice["finish_reason"], FinishReason.FAILED)
    return True


def _finish_stream(record: Request, errors: list[str]) -> None:
    if record.finish_reason is None:
        _fail(record, errors, "stream ended without a finish_reason")
        return
    record.finish_s = record.token_times_s[-1] if record.token_times_s else None


def _fail(record: Request, errors: list[str], message: str,
          reason: FinishReason | None = None) -> None:
    record.finish_reason = reason or FinishReason.FAILED
    record.finish_detail = message
    errors.append(f"{record.request_id}: {message}")


def summarize_bench(result: BenchResult, slo: Slo | None = None) -> dict:
    """sim.metrics.summarize's keys, minus the per-step ones a client cannot see."""
    run = RunResult(requests=result.requests, steps=[], num_preemptions=0, num_blocks=1,
                    max_num_seqs=0)
    summary = summarize(run, slo)
    for key in _SERVER_SIDE_KEYS:
        summary.pop(key, None)
    summary["preemptions"] = result.preemptions
    summary["retried"] = result.retried
    return summary
