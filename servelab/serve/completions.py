"""POST /v1/completions, and what chat shares with it: submit to the engine, read text back.

A request is checked completely before it is queued (lengths against max_model_len and the
KV pool), so the engine never rejects one the HTTP side accepted. Its tokens come back as
settled text (`pieces`); a stop string ends the text and aborts the request, which frees its
KV at once. A streamed response whose client disconnects aborts its request (the generator's
`finally`); a non-streamed one watches the connection with a task that waits for
http.disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, StreamingResponse

from servelab.serve.handoff import Draining, Overloaded, StreamEvent, TokenSink
from servelab.serve.json_body import parse_json
from servelab.serve.protocol import (
    DEFAULT_MAX_TOKENS,
    SSE_DONE,
    ApiError,
    CompletionRequest,
    GenerationRequest,
    completion,
    finish_label,
    header_text,
    parse_completion,
    sse,
    usage,
    usage_chunk,
)
from servelab.serve.request_log import row_of
from servelab.serve.state import ServeState
from servelab.serve.tokenizer import StopStrings, StreamDecoder
from sim.engine.core import FinishReason, Request, SamplingParams

_ERRORS = {FinishReason.FAILED: (500, "server_error"),
           FinishReason.REJECTED: (400, "invalid_request_error")}


@dataclass(slots=True)
class Generation:
    """A submitted request and what turns its tokens back into text."""

    request: Request
    sink: TokenSink
    decoder: StreamDecoder
    stops: StopStrings
    num_output: int = 0  # output tokens answered for: none after the one that hit a stop
    finish: str | None = None  # the OpenAI finish_reason, once the request is over


@dataclass(frozen=True, slots=True)
class Piece:
    """Newly settled text and the tokens that came with it; `finish` is set on the last."""

    text: str
    token_ids: list[int]
    finish: str | None = None


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


def check_model(state: ServeState, body: GenerationRequest) -> None:
    """404 unless the body names this server's model (or none)."""
    name = state.config.model_name
    if body.model is not None and body.model != name:
        raise ApiError(404, f"model {body.model!r} does not exist; this server serves "
                       f"{name!r}", param="model", code="model_not_found")


def build_request(state: ServeState, body: GenerationRequest, prompt: list[int],
                  default_max_tokens: int, arrival_s: float, tenant: str | None) -> Request:
    """The scheduler Request of a valid body and its prompt ids."""
    _check_ids(body.stop_token_ids, state.vocab_size, "stop_token_ids")
    max_tokens = body.max_tokens if body.max_tokens is not None else default_max_tokens
    return Request(state.next_request_id(), arrival_s, len(prompt), max_tokens, prompt,
                   _sampling(state, body), priority=body.priority, tenant=tenant or "")


def _check_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ApiError(400, f"{param}: token id {bad} is outside the vocabulary [0, "
                       f"{vocab_size})", param=param)


def _sampling(state: ServeState, body: GenerationRequest) -> SamplingParams:
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


def start_generation(state: ServeState, http: HttpRequest, body: GenerationRequest,
                     prompt: list[int], default_max_tokens: int, arrival_s: float
                     ) -> Generation:
    """Build, check and queue the request; 400/503 for what cannot be queued."""
    tenant = header_text(http.headers, "x-tenant") or body.user
    request = build_request(state, body, prompt, default_max_tokens, arrival_s, tenant)
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
    return Generation(request, sink, state.tokenizer.decoder(), StopStrings(body.stop_strings()))


async def create_completion(state: ServeState, http: HttpRequest):
    """The whole endpoint after authentication."""
    arrival_s = state.engine.clock.now()
    body = parse_completion(parse_json(await read_body(http, state.config.max_body_bytes)))
    check_model(state, body)
    if isinstance(body.prompt, str):
        prompt = state.tokenizer.encode(body.prompt)
        if not prompt:
            raise ApiError(400, "prompt is empty", param="prompt")
    else:
        prompt = body.prompt
        _check_ids(prompt, state.vocab_size, "prompt")
    gen = start_generation(state, http, body, prompt, DEFAULT_MAX_TOKENS, arrival_s)
    if body.stream:
        return event_stream(_stream(state, gen, body))
    text, token_ids = await collect(state, http, gen)
    ids = token_ids if body.return_token_ids else None
    return JSONResponse(completion(gen.request.request_id, int(time.time()),
                                   state.config.model_name, text, gen.finish, ids,
                                   usage_of(gen)))


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


async def pieces(state: ServeState, gen: Generation) -> AsyncIterator[Piece]:
    """The request's text as it settles; ApiError if the engine failed or rejected it."""
    while gen.finish is None:
        event = await _next(gen.sink)
        reason = event.finish_reason
        if reason in _ERRORS:
            gen.finish = reason.value
            status, kind = _ERRORS[reason]
            raise ApiError(status, event.detail or reason.value, type_=kind, code=reason.value)
        gen.num_output += len(event.token_ids)
        final = reason is not None
        text, stopped = gen.stops.feed(gen.decoder.feed(event.token_ids, final), final)
        if stopped and not final:
            await _abort_and_wait(state, gen)
        gen.finish = "stop" if stopped else finish_label(reason) if final else None
        yield Piece(text, event.token_ids, gen.finish)


async def _abort_and_wait(state: ServeState, gen: Generation) -> None:
    """Abort a request that hit a stop string; return once the engine has freed it."""
    state.engine.abort(gen.request.request_id, FinishReason.STOP)
    # Its finish event comes after the abort is applied (KV freed, log row written); the
    # tokens it carries were generated past the stop string and are dropped.
    while (await gen.sink.queue.get()).finish_reason is None:
        pass


def settle(state: ServeState, gen: Generation) -> None:
    """Abort the request unless it is over (its reader left, or the server is closing)."""
    if gen.finish is None:
        state.engine.abort(gen.request.request_id)


async def collect(state: ServeState, http: HttpRequest, gen: Generation
                  ) -> tuple[str, list[int]]:
    """All the text and token ids of a request; a client that disconnects aborts it."""
    watcher = asyncio.create_task(_abort_on_disconnect(state, http, gen.request.request_id))
    texts: list[str] = []
    token_ids: list[int] = []
    try:
        async for piece in pieces(state, gen):
            texts.append(piece.text)
            token_ids.extend(piece.token_ids)
    finally:
        watcher.cancel()
        settle(state, gen)
    await durable(state, gen.sink)
    return "".join(texts), token_ids


async def _stream(state: ServeState, gen: Generation, body: CompletionRequest
                  ) -> AsyncIterator[bytes]:
    rid, model, created = gen.request.request_id, state.config.model_name, int(time.time())
    with_ids = body.return_token_ids
    try:
        async for piece in pieces(state, gen):
            if piece.text or (with_ids and piece.token_ids):
                ids = piece.token_ids if with_ids else None
                yield sse(completion(rid, created, model, piece.text, None, ids,
                                     chunk_usage(gen, body)))
            if piece.finish is not None:
                await durable(state, gen.sink)  # the last tokens went out before the commit
                # Without include_usage the usage rides the finish chunk (as before OpenAI's
                # stream_options existed); with it, its own chunk with no choices.
                last = chunk_usage(gen, body) if body.include_usage else usage_of(gen)
                yield sse(completion(rid, created, model, "", piece.finish,
                                     [] if with_ids else None, last))
        if body.include_usage:
            yield sse(usage_chunk(rid, "text_completion", created, model, usage_of(gen)))
    except ApiError as exc:
        yield sse(exc.body())
    finally:
        settle(state, gen)
    yield SSE_DONE


def event_stream(stream: AsyncIterator[bytes]) -> StreamingResponse:
    """A server-sent-events response."""
    return StreamingResponse(stream, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def durable(state: ServeState, sink: TokenSink) -> None:
    """Wait (bounded) until the request's log row is committed."""
    if sink.durable is not None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(sink.durable), state.config.durable_wait_s)


def usage_of(gen: Generation) -> dict:
    """The usage of a request: finished, or (mid-stream) so far."""
    # num_cached_tokens is written once, by the engine thread at the first admission, before
    # it posts any event of this request; the finish event read here came after it.
    request = gen.request
    return usage(request.prompt_len, gen.num_output, request.num_cached_tokens)


def chunk_usage(gen: Generation, body: GenerationRequest) -> dict | None:
    """The usage so far, for a chunk of a stream that asked for continuous_usage_stats."""
    return usage_of(gen) if body.continuous_usage else None


async def _abort_on_disconnect(state: ServeState, http: HttpRequest, request_id: str) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass
    state.engine.abort(request_id)
