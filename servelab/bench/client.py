"""The trace-replay load client: send each request at its trace time (or as
servelab.bench.closed_loop
schedules sessions and closed-loop users), time every streamed token.

Like `vllm bench serve`: prompts are token ids (synthesized for traces that only carry
lengths, with really shared leading tokens where the trace says so: servelab.bench.prompts),
max_tokens is the trace's output length, EOS is ignored, every response streams.
Each request becomes a sim.engine.core.Request stamped with client-side times (send, every token,
last token), so sim.replay.metrics.summarize computes the same keys as the simulator.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from servelab.bench.closed_loop import drive
from servelab.bench.connection import (
    COUNTERS,
    BenchConfig,
    encode_json,
    make_client,
    model_card,
    post_once_more_if_unsent,
    scrape_counters,
)
from servelab.bench.prompts import (
    Conversation,
    PromptPlan,
    conversation_prompt,
    prompt_plans,
    prompt_tokens,
    remember_turn,
)
from sim.engine.core import FinishReason, Request
from sim.replay.metrics import Slo, summarize
from sim.replay.simulation import RunResult
from workloads.sessions import chains_of
from workloads.trace import Trace

# Step-level keys of sim.replay.metrics.summarize that a client cannot observe.
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
    session_id: str | None = None  # turns of one session wait for each other
    turn: int = 0
    think_s: float = 0.0  # after the previous turn's answer, before this one
    plan: PromptPlan | None = None  # rebuilds a later turn's prompt around the real answers


@dataclass
class BenchResult:
    """Every request as the client saw it, the errors, server preemptions if scraped, and
    how many requests were sent again after a first try that never reached the server."""

    requests: list[Request]
    errors: list[str] = field(default_factory=list)
    preemptions: int | None = None
    retried: int = 0
    cut_short: str | None = None  # why the run ended before every request did, if it did
    # The server's prefix cache hits over the prompt tokens it looked up during the run
    # (from /metrics); None if it does not say.
    prefix_cache_hit_rate: float | None = None


def bench_requests(trace: Trace, vocab_size: int, seed: int = 0, salt: str = ""
                   ) -> list[BenchRequest]:
    """The trace's requests with synthetic prompts (equal prefix segments share tokens; a
    `salt` makes every token differ from another salt's) and their places in sessions."""
    table = trace.table
    tenants = table["tenant"].tolist() if "tenant" in table.columns else [None] * len(trace)
    if trace.has_sessions:
        sessions = zip(table["session_id"].tolist(), table["turn"].tolist(),
                       table["think_s"].tolist(), strict=True)
    else:
        sessions = ((None, 0, 0.0) for _ in range(len(trace)))
    out = []
    for rid, arrival, output_len, plan, tenant, (session, turn, think_s) in zip(
            trace.request_ids, trace.arrival_s.tolist(), trace.output_len.tolist(),
            prompt_plans(trace, seed, salt), tenants, sessions, strict=True):
        out.append(BenchRequest(rid, arrival, prompt_tokens(plan, vocab_size), output_len,
                                tenant, session, int(turn), float(think_s), plan))
    return out


async def replay_trace(trace: Trace, config: BenchConfig, vocab_size: int | None = None,
                       seed: int = 0, on_done: Callable[[], None] | None = None,
                       users: int | None = None) -> tuple[str, int, BenchResult]:
    """Ask the server for its model (and vocab, unless given), then replay the trace: the
    model id, the vocab size the prompts were drawn from, and the result."""
    async with make_client(config) as client:
        card = await model_card(client, config.model)
    vocab = vocab_size or card.get("vocab_size")
    if not vocab:
        raise ValueError(f"{config.url} does not report its vocab size; pass --vocab-size")
    result = await run_bench(bench_requests(trace, int(vocab), seed), config, on_done, users)
    return card["id"], int(vocab), result


# Looks at a run in progress (every record, the ids of those sent, seconds since the start)
# and says whether to stop it now: a caller whose verdict is already certain.
StopCheck = Callable[[list[Request], set[str], float], bool]
STOP_POLL_S = 0.1  # how often a StopCheck looks
TIME_LIMIT = "unfinished after the {timeout_s} s time limit"
STOPPED = "unfinished when the run was stopped early"


async def run_bench(requests: list[BenchRequest], config: BenchConfig,
                    on_done: Callable[[], None] | None = None, users: int | None = None,
                    stop: StopCheck | None = None) -> BenchResult:
    """Send every request as servelab.bench.closed_loop schedules it (`users`: that many closed-loop
    users); stop waiting after config.timeout_s, or once `stop` says so.

    `on_done` is called as each request ends (a progress bar).
    """
    async with make_client(config) as client, make_client(config, pooled=False) as fresh:
        model = (await model_card(client, config.model))["id"]
        before = await scrape_counters(client)
        records = [Request(r.request_id, r.arrival_s, len(r.prompt_token_ids), r.max_tokens,
                           list(r.prompt_token_ids)) for r in requests]
        run = _Run(client, fresh, model, asyncio.Semaphore(config.max_concurrency
                                                           or len(requests) or 1))

        async def send_row(row: int, conversation: Conversation | None) -> None:
            try:
                await _send(run, requests[row], records[row], conversation)
            finally:
                if on_done is not None:
                    on_done()

        chains = chains_of([r.session_id for r in requests], [r.turn for r in requests],
                           [r.arrival_s for r in requests])
        driver = asyncio.create_task(drive(chains, [r.think_s for r in requests], send_row,
                                           run.t0, users))
        cut_short = await _wait(driver, run, config.timeout_s, records, stop)
        driver.cancel()
        await asyncio.gather(driver, return_exceptions=True)
        if cut_short is None:
            driver.result()  # a scheduling error surfaces here
        for record in records:
            if record.finish_reason is None:
                _fail(record, run.errors, cut_short or "never sent")
        after = await scrape_counters(client)
    preemptions, hits, queries = (after[k] - before[k] if k in before and k in after else None
                                  for k in COUNTERS)
    hit_rate = hits / queries if hits is not None and queries else None
    return BenchResult(records, run.errors, None if preemptions is None else int(preemptions),
                       run.retried, cut_short, hit_rate)


async def _wait(driver: asyncio.Task, run: _Run, timeout_s: float, records: list[Request],
                stop: StopCheck | None) -> str | None:
    """Until every request ended; why the run was cut short, or None."""
    deadline_s = run.t0 + timeout_s
    while True:
        left_s = deadline_s - time.perf_counter()
        if left_s <= 0:
            return TIME_LIMIT.format(timeout_s=timeout_s)
        done, _ = await asyncio.wait({driver}, timeout=min(left_s, STOP_POLL_S) if stop
                                     else left_s)
        if done:
            return None
        if stop is not None and stop(records, run.sent, time.perf_counter() - run.t0):
            return STOPPED


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
    sent: set[str] = field(default_factory=set)  # ids of the requests sent so far


async def _send(run: _Run, sent: BenchRequest, record: Request,
                conversation: Conversation | None = None) -> None:
    async with run.gate:
        if conversation is not None and sent.plan is not None:
            if conversation.ids_missing:
                _fail(record, run.errors, "the server streamed an earlier answer of the "
                      "session without token ids (return_token_ids); the conversation "
                      "cannot be carried on")
                return
            record.prompt_token_ids = conversation_prompt(sent.plan, record.prompt_token_ids,
                                                          conversation)
            record.prompt_len = len(record.prompt_token_ids)
        await _post(run, sent, record)
    if conversation is not None and sent.plan is not None:
        remember_turn(conversation, sent.plan, record.output_token_ids,
                      len(record.token_times_s))


async def _post(run: _Run, sent: BenchRequest, record: Request) -> None:
    payload = {"model": run.model, "prompt": record.prompt_token_ids,
               "max_tokens": sent.max_tokens, "temperature": 0.0, "ignore_eos": True,
               "stream": True, "return_token_ids": True}
    if sent.tenant is not None:
        payload["user"] = sent.tenant
    # TTFT counts from the actual send: once the body is on the connection (aiohttp's hook;
    # a second try's send replaces the first's), not from before the client encoded and
    # framed a prompt of thousands of token ids, its own work and none of the server's.
    body = encode_json(payload)

    def sent() -> None:
        record.arrival_s = time.perf_counter() - run.t0

    sent()  # (a request whose body never goes out keeps this one)
    run.sent.add(record.request_id)
    try:
        response, again = await post_once_more_if_unsent(run.client, run.fresh,
                                                         "v1/completions", body, sent)
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
    """sim.replay.metrics.summarize's keys, minus the per-step ones a client cannot see."""
    run = RunResult(requests=result.requests, steps=[], num_preemptions=0, num_blocks=1,
                    max_num_seqs=0)
    summary = summarize(run, slo)
    for key in _SERVER_SIDE_KEYS:
        summary.pop(key, None)
    summary["preemptions"] = result.preemptions
    if result.prefix_cache_hit_rate is not None:  # else the client cannot know it
        summary["prefix_cache_hit_rate"] = result.prefix_cache_hit_rate
    summary["retried"] = result.retried
    return summary
