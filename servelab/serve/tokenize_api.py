"""vLLM's POST /tokenize and POST /detokenize over the server's tokenizer, so clients that
align prompts to token counts (`vllm bench serve`) can do it against servelab too."""

from __future__ import annotations

import json
import reprlib
from typing import Any

from fastapi import FastAPI, Request

from servelab.serve.api import check_bearer
from servelab.serve.completions import read_body
from servelab.serve.protocol import ApiError
from servelab.serve.state import ServeState

ROLES = ("system", "user", "assistant", "tool", "developer")


def add_tokenize_routes(app: FastAPI, state: ServeState) -> FastAPI:
    """Add /tokenize and /detokenize to `app` (behind its API key); returns `app`."""
    key = state.config.api_key.encode("utf-8") if state.config.api_key is not None else None

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        check_bearer(request.headers.get("authorization", ""), key)
        body = await _json_object(request, state)
        tokens = tokenize_body(state, body)
        return {"tokens": tokens, "count": len(tokens),
                "max_model_len": state.config.max_model_len, "token_strs": None}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        check_bearer(request.headers.get("authorization", ""), key)
        body = await _json_object(request, state)
        return {"prompt": detokenize_body(state, body)}

    return app


def tokenize_body(state: ServeState, body: dict[str, Any]) -> list[int]:
    """The token ids of {"prompt": text} or {"messages": [...]} (the chat prompt)."""
    if ("prompt" in body) == ("messages" in body):
        raise _bad("give exactly one of 'prompt' (a string) and 'messages' (a list)", None)
    if "prompt" in body:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise _bad(f"must be a string, got {type(prompt).__name__}", "prompt")
        return state.tokenizer.encode(prompt)
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise _bad("must be a non-empty list of {role, content} objects", "messages")
    checked = [_message(index, message) for index, message in enumerate(messages)]
    try:
        return state.tokenizer.encode_chat(checked)
    except ValueError as exc:
        raise _bad(str(exc), "messages") from None


def detokenize_body(state: ServeState, body: dict[str, Any]) -> str:
    """The text of {"tokens": [ids]}; every id must be one the model has."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise _bad("must be a list of token ids", "tokens")
    for index, token in enumerate(tokens):
        if type(token) is not int or not 0 <= token < state.vocab_size:
            raise _bad(f"tokens[{index}]: {reprlib.repr(token)} is not a token id in "
                       f"[0, {state.vocab_size})", "tokens")
    return state.tokenizer.decoder().feed(tokens, final=True)


async def _json_object(request: Request, state: ServeState) -> dict[str, Any]:
    raw = await read_body(request, state.config.max_body_bytes)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(f"the body is not JSON ({exc})", None) from None
    if not isinstance(body, dict):
        raise _bad(f"the body must be a JSON object, got {type(body).__name__}", None)
    return body


def _message(index: int, message: Any) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise _bad(f"{where}: must be an object with a role among {', '.join(ROLES)}",
                   "messages")
    if not isinstance(message.get("content"), str):
        raise _bad(f"{where}.content: must be a string", "messages")
    return {"role": message["role"], "content": message["content"]}


def _bad(message: str, param: str | None) -> ApiError:
    return ApiError(400, f"{param}: {message}" if param else message, param=param)
