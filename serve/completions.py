"""POST /v1/completions: validate, submit to the engine thread, stream or collect the tokens.

A request is checked completely before it is queued (lengths against max_model_len and the
KV pool), so the engine never rejects one the HTTP side accepted. A streamed response whose
client disconnects aborts its request (the generator's `finally`); a non-streamed one
watches the connection with a task that waits for http.disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, StreamingResponse

from serve.handoff import Draining, Overloaded, StreamEvent, TokenSink
from serve.protocol import (
    DEFAULT_MAX_TOKENS,
    SSE_DONE,
    ApiError,
    CompletionRequest,
    completion,
    error_body,
    finish_label,
    parse_completion,
    sse,
    usage,
)
from serve.request_log import row_of
from serve.state import ServeState
from serve.tokenizer import StreamDecoder
from sim.core import FinishReason, Request, SamplingParams

_ERRORS = {FinishReason.FAILED: (500, "server_error"),
           FinishReason.REJECTED: (400, "invalid_request_error")}


async def read_body(http: HttpRequest, limit: int) -> bytes:
    """The request body, or 413 as soon as it is known to exceed `limit` bytes."""
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large")


def build_request(state: ServeState, body: CompletionRequest, arrival_s: float) -> Request:
    """The scheduler Request of a valid body; ApiError(400/404) for what cannot be served."""
    cfg = state.config
    if body.model is not None and body.model != cfg.model_name:
        raise ApiError(404, f"model {body.model!r} does not exist; this server serves "
                       f"{cfg.model_name!r}", param="model", code="model_not_found")
    if isinstance(body.prompt, str):
        prompt = state.tokenizer.encode(body.prompt)
        if not prompt:
            raise ApiError(400, "prompt is empty", param="prompt")
    else:
        prompt = body.prompt
        _check_ids(prompt, state.vocab_size, "prompt")
    _check_ids(body.stop_token_ids, state.vocab_size, "stop_token_ids")
    max_tokens = body.max_tokens if body.max_tokens is not None else DEFAULT_MAX_TOKENS
    return Request(state.next_request_id(), arrival_s, len(prompt), max_tokens, prompt,
                   _sampling(state, body))


def _check_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ApiError(400, f"{param}: token id {bad} is outside the vocabulary [0, "
                       f"{vocab_size})", param=param)


def _sampling(state: ServeState, body: CompletionRequest) -> SamplingParams:
    return SamplingParams(
        temperature=body.temperature, top_p=body.top_p, top_k=max(body.top_k, 0),
        seed=body.seed if body.seed is not None else state.next_seed(),
        stop_token_ids=tuple(body.stop_token_ids), eos_token_id=state.tokenizer.eos_token_id,
        ignore_eos=body.ignore_eos,
    )


def check_lengths(state: ServeState, request: Request) -> None:
    """400 unless prompt + max_tokens fits max_model_len and the KV pool."""
    limit = state.config.max_model_len
    if request.prompt_len > limit:
        raise ApiError(400, f"prompt has {request.prompt_len} tokens, more than max_model_len "
                       f"{limit}", param="prompt", code="context_length_exceeded")
    total = request.prompt_len + request.max_new_tokens
    if total > limit:
        raise ApiError(400, f"prompt ({request.prompt_len} tokens) + max_tokens "
                       f"({request.max_new_tokens}) = {total} exceeds max_model_len {limit}",
                       param="max_tokens", code="context_length_exceeded")
    bm = state.engine.scheduler.block_manager  # immutable sizes: safe to read from here
    if bm.blocks_for(total) > bm.num_blocks:
        raise ApiError(400, f"prompt + max_tokens = {total} tokens needs "
                       f"{bm.blocks_for(total)} KV blocks; the pool has {bm.num_blocks}",
                       param="max_tokens", code="context_length_exceeded")


async def create_completion(state: ServeState, http: HttpRequest):
    """The whole endpoint after authentication."""
    arrival_s = state.engine.clock.now()
    body = parse_completion(await read_body(http, state.config.max_body_bytes))
    tenant = http.headers.get("x-tenant") or body.user
    request = build_request(state, body, arrival_s)
    sink = TokenSink(wait_durable=state.request_log is not None)
    try:
        check_lengths(state, request)
        state.engine.submit(request, sink, tenant)
    except ApiError:
        _log_refused(state, request, tenant, "rejected", 400)
        raise
    except (Overloaded, Draining) as exc:
        refused = "overloaded" if isinstance(exc, Overloaded) else "draining"
        _log_refused(state, request, tenant, refused, 503)
        raise ApiError(503, f"server {refused}: {exc}; retry later", type_="server_error",
                       code=refused,
                       headers={"Retry-After": str(state.config.retry_after_s)}) from None
    decoder = state.tokenizer.decoder()
    if body.stream:
        stream = _stream(state, request, sink, decoder, body.return_token_ids)
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await _collect(state, http, request, sink, decoder, body.return_token_ids)


def _log_refused(state: ServeState, request: Request, tenant: str | None, reason: str,
                 status: int) -> None:
    """Log a request the server saw but did not queue: the replay should still see it."""
    if state.request_log is not None:
        request.finish_s = request.arrival_s
        row = row_of(request, state.engine.clock.start_unix, tenant, reason, status)
        state.request_log.write(row)


async def _next(sink: TokenSink) -> StreamEvent:
    """The next event merged with any already queued behind it (a slow reader catches up)."""
    event = await sink.queue.get()
    if event.finish_reason is not None or sink.queue.empty():
        return event
    tokens = list(event.token_ids)
    while not sink.queue.empty() and event.finish_reason is None:
        event = sink.queue.get_nowait()
        tokens.extend(event.token_ids)
    return StreamEvent(tokens, event.finish_reason, event.detail)


async def _durable(state: ServeState, sink: TokenSink) -> None:
    """Wait (bounded) until the request's log row is committed."""
    if sink.durable is not None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(sink.durable), state.config.durable_wait_s)


async def _stream(state: ServeState, request: Request, sink: TokenSink,
                  decoder: StreamDecoder, with_ids: bool) -> AsyncIterator[bytes]:
    rid, model, created = request.request_id, state.config.model_name, int(time.time())
    num_out, finished = 0, False
    try:
        while not finished:
            event = await _next(sink)
            reason = event.finish_reason
            num_out += len(event.token_ids)
            if reason in _ERRORS:
                finished = True
                yield sse(error_body(event.detail or reason.value, _ERRORS[reason][1],
                                     code=reason.value))
                break
            text = decoder.feed(event.token_ids, final=reason is not None)
            ids = event.token_ids if with_ids else None
            if reason is None:
                yield sse(completion(rid, created, model, text, None, ids))
                continue
            if text or event.token_ids:  # the last tokens go out before the log commit
                yield sse(completion(rid, created, model, text, None, ids))
            await _durable(state, sink)
            finished = True
            yield sse(completion(rid, created, model, "", finish_label(reason),
                                 [] if with_ids else None, _usage(request, num_out)))
        yield SSE_DONE
    finally:
        if not finished:  # the client went away (or the server is closing the stream)
            state.engine.abort(rid)


async def _collect(state: ServeState, http: HttpRequest, request: Request, sink: TokenSink,
                   decoder: StreamDecoder, with_ids: bool) -> JSONResponse:
    watcher = asyncio.create_task(_abort_on_disconnect(state, http, request.request_id))
    tokens: list[int] = []
    try:
        while True:
            event = await sink.queue.get()
            tokens.extend(event.token_ids)
            if event.finish_reason is not None:
                break
    finally:
        watcher.cancel()
    reason = event.finish_reason
    if reason in _ERRORS:
        status, kind = _ERRORS[reason]
        raise ApiError(status, event.detail or reason.value, type_=kind, code=reason.value)
    await _durable(state, sink)
    text = decoder.feed(tokens, final=True)
    body = completion(request.request_id, int(time.time()), state.config.model_name, text,
                      finish_label(reason), tokens if with_ids else None,
                      _usage(request, len(tokens)))
    return JSONResponse(body)


def _usage(request: Request, completion_tokens: int) -> dict:
    """The usage of a finished request."""
    # num_cached_tokens is written once, by the engine thread at the first admission, before
    # it posts any event of this request; the finish event read here came after it.
    return usage(request.prompt_len, completion_tokens, request.num_cached_tokens)


async def _abort_on_disconnect(state: ServeState, http: HttpRequest, request_id: str) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass
    state.engine.abort(request_id)
