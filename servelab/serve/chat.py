"""POST /v1/chat/completions: messages become a prompt (servelab/serve/tokenizer.py), then as
completions.

The answer is OpenAI's chat.completion object, or chat.completion.chunk events: the first
carries the assistant role, then content deltas, then an empty delta with the finish_reason.
"""

from __future__ import annotations

import reprlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse
from pydantic import Field

from servelab.serve.completions import (
    Generation,
    check_model,
    chunk_usage,
    collect,
    durable,
    event_stream,
    pieces,
    read_body,
    settle,
    start_generation,
    usage_of,
)
from servelab.serve.json_body import parse_json
from servelab.serve.protocol import (
    SSE_DONE,
    ApiError,
    GenerationRequest,
    sse,
    usage_chunk,
    valid_text,
    validate_body,
)
from servelab.serve.state import ServeState

ROLES = ("system", "user", "assistant", "tool")


class ChatRequest(GenerationRequest):
    """The body of POST /v1/chat/completions; `messages` is checked by `chat_messages`."""

    messages: list[Any] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # OpenAI's newer max_tokens
    # Accepted only at their no-op values; anything else is a clear 400.
    logprobs: bool = False
    tools: list[Any] | None = None


def parse_chat(data: dict[str, Any]) -> tuple[ChatRequest, list[dict[str, str]]]:
    """A valid body (from parse_json) and its messages as {"role", "content"} strings;
    ApiError(400) otherwise."""
    body = validate_body(data, ChatRequest)
    if body.logprobs:
        raise ApiError(400, "logprobs=True is not supported", param="logprobs")
    if body.tools:
        raise ApiError(400, "tools are not supported", param="tools")
    if body.max_completion_tokens is not None:  # it wins over max_tokens, as in vLLM
        body.max_tokens = body.max_completion_tokens
    return body, [_message(i, message) for i, message in enumerate(body.messages)]


def _bad(message: str) -> ApiError:
    return ApiError(400, message, param="messages")


def _message(index: int, message: Any) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _bad(f"{where}: must be an object with 'role' and 'content', got "
                   f"{type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role: must be one of {', '.join(ROLES)}; got {reprlib.repr(role)}")
    content = message.get("content")
    if content is None and role == "assistant":  # a turn that only called tools
        content = ""
    return {"role": role, "content": _content(where, content)}


def _content(where: str, content: Any) -> str:
    """A message's text: a string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return _text(f"{where}.content", content)
    if not isinstance(content, list):
        raise _bad(f"{where}.content: must be a string or a list of text parts, got "
                   f"{type(content).__name__}")
    texts = []
    for index, part in enumerate(content):
        at = f"{where}.content[{index}]"
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise _bad(f"{at}: only text parts {{'type': 'text', 'text': string}} are "
                       f"supported; got {reprlib.repr(kind)}")
        if not isinstance(part.get("text"), str):
            raise _bad(f"{at}.text: must be a string")
        texts.append(_text(f"{at}.text", part["text"]))
    return "\n".join(texts)


def _text(where: str, text: str) -> str:
    try:
        return valid_text(text)
    except ValueError as exc:
        raise _bad(f"{where}: {exc}") from None


def chat_prompt(state: ServeState, messages: list[dict[str, str]]) -> list[int]:
    """The prompt ids of the messages; 400 if the chat template refuses them."""
    try:
        prompt = state.tokenizer.encode_chat(messages)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    if not prompt:
        raise _bad("messages: the chat template made an empty prompt")
    return prompt


def _room(state: ServeState, prompt_len: int) -> int:
    """The default max_tokens: what max_model_len and the KV pool leave after the prompt."""
    bm = state.engine.scheduler.block_manager
    return max(min(state.config.max_model_len, bm.num_blocks * bm.block_size) - prompt_len, 1)


async def create_chat_completion(state: ServeState, http: HttpRequest):
    """The whole endpoint after authentication."""
    arrival_s = state.engine.clock.now()
    body, messages = parse_chat(parse_json(await read_body(http, state.config.max_body_bytes)))
    check_model(state, body)
    prompt = chat_prompt(state, messages)
    gen = start_generation(state, http, body, prompt, _room(state, len(prompt)), arrival_s)
    if body.stream:
        return event_stream(_stream(state, gen, body))
    text, token_ids = await collect(state, http, gen)
    message = {"role": "assistant", "content": text}
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                              "finish_reason": gen.finish}
    if body.return_token_ids:
        choice["token_ids"] = token_ids
    return JSONResponse({"id": _chat_id(gen), "object": "chat.completion",
                         "created": int(time.time()), "model": state.config.model_name,
                         "choices": [choice], "usage": usage_of(gen)})


def _chat_id(gen: Generation) -> str:
    return "chat" + gen.request.request_id  # chatcmpl-..., as OpenAI's ids read


def chat_chunk(chunk_id: str, created: int, model: str, delta: dict[str, str],
               finish: str | None = None, token_ids: list[int] | None = None,
               usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """One chat.completion.chunk with one choice (and the usage so far, if given)."""
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                              "finish_reason": finish}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    chunk = {"id": chunk_id, "object": "chat.completion.chunk", "created": created,
             "model": model, "choices": [choice]}
    if usage is not None:
        chunk["usage"] = usage
    return chunk


async def _stream(state: ServeState, gen: Generation, body: ChatRequest
                  ) -> AsyncIterator[bytes]:
    chunk_id, model, created = _chat_id(gen), state.config.model_name, int(time.time())
    with_ids = body.return_token_ids
    try:
        yield sse(chat_chunk(chunk_id, created, model, {"role": "assistant", "content": ""},
                             usage=chunk_usage(gen, body)))
        async for piece in pieces(state, gen):
            if piece.text or (with_ids and piece.token_ids):
                ids = piece.token_ids if with_ids else None
                yield sse(chat_chunk(chunk_id, created, model, {"content": piece.text}, None,
                                     ids, chunk_usage(gen, body)))
            if piece.finish is not None:
                await durable(state, gen.sink)  # the last tokens went out before the commit
                yield sse(chat_chunk(chunk_id, created, model, {}, piece.finish,
                                     [] if with_ids else None, chunk_usage(gen, body)))
        if body.include_usage:
            yield sse(usage_chunk(chunk_id, "chat.completion.chunk", created, model,
                                  usage_of(gen)))
    except ApiError as exc:
        yield sse(exc.body())
    finally:
        settle(state, gen)
    yield SSE_DONE
