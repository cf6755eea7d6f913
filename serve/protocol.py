"""The OpenAI completions wire format: the request body model, errors, responses and chunks."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.core import FinishReason

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class ApiError(Exception):
    """An error the server answers with an OpenAI-style error object."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """{"error": {"message", "type", "param", "code"}}."""
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class CompletionRequest(BaseModel):
    """The body of POST /v1/completions; strict: "5" is not an integer, true is not 1."""

    model_config = ConfigDict(strict=True, extra="ignore")

    prompt: str | list[int]
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=-1)  # 0 or -1 disable top-k (vLLM uses -1)
    seed: int | None = Field(default=None, ge=0, lt=1 << 63)
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # usage always rides the last chunk
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)
    user: str | None = None
    return_token_ids: bool = False  # vLLM's extension: token ids in every choice
    # Accepted only at their no-op values; anything else is a clear 400.
    n: int = 1
    echo: bool = False
    logprobs: int | None = None
    stop: str | list[str] | None = None


_UNSUPPORTED = (("n", 1), ("echo", False), ("logprobs", None))


def parse_completion(raw: bytes) -> CompletionRequest:
    """Validate a request body; raise ApiError(400) naming the first bad field."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(data).__name__}")
    try:
        body = CompletionRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"][:1]) or None
        message = f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"
        if param == "prompt" and first["type"] != "missing":  # the union's errors confuse
            message = "prompt: must be a string or a non-empty list of integer token ids"
        raise ApiError(400, message, param=param) from None
    for field, allowed in _UNSUPPORTED:
        if getattr(body, field) != allowed:
            raise ApiError(400, f"{field}={getattr(body, field)!r} is not supported", param=field)
    if body.stop:
        raise ApiError(400, "stop strings are not supported; use stop_token_ids", param="stop")
    if isinstance(body.prompt, list) and not body.prompt:
        raise ApiError(400, "prompt is empty", param="prompt")
    return body


def finish_label(reason: FinishReason) -> str:
    """The OpenAI finish_reason of a scheduler finish reason (vLLM's 'abort' for aborts)."""
    if reason is FinishReason.ABORTED:
        return "abort"
    return reason.value


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage object; prompt_tokens includes the cached_tokens the prefix cache served."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def completion(request_id: str, created: int, model: str, text: str, finish: str | None,
               token_ids: list[int] | None, usage: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """A completion object; `usage` rides the non-streamed body and the last chunk only."""
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    body: dict[str, Any] = {"id": request_id, "object": "text_completion", "created": created,
                            "model": model, "choices": [choice]}
    if usage is not None:
        body["usage"] = usage
    return body


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
