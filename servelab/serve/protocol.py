"""The OpenAI wire format: request body models, errors, and the completion objects answered."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from sim.engine.core import FinishReason

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_STOP_CHARS = 1024  # bounds the text a stream holds back and the cost of matching it


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


def valid_text(text: str) -> str:
    """text itself; ValueError if it holds a lone UTF-16 surrogate."""
    # JSON may escape one ("\udcff"); json.loads keeps it, and then UTF-8 encoding (the
    # tokenizer, the JSON response, the SQLite log) raises. Refuse it at the door instead.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains a lone UTF-16 surrogate at index {exc.start}; text must "
                         "be valid Unicode") from None
    return text


Text = Annotated[str, AfterValidator(valid_text)]


class StreamOptions(BaseModel):
    """OpenAI's stream_options."""

    model_config = ConfigDict(strict=True, extra="ignore")

    include_usage: bool = False  # a last chunk with empty choices carries the usage
    # vLLM's extension: with include_usage, every chunk carries the usage so far.
    continuous_usage_stats: bool = False


class GenerationRequest(BaseModel):
    """Fields both endpoints accept; strict: "5" is not an integer, true is not 1."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: Text | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=-1, lt=1 << 63)  # 0 or -1 disable top-k (vLLM uses -1)
    seed: int | None = Field(default=None, ge=0, lt=1 << 63)
    stream: bool = False
    stream_options: StreamOptions | None = None  # read only when streaming
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)
    stop: Text | list[Text] | None = None
    # Lower is served first under --queue priority; 64-bit, as the seed and top_k.
    priority: int = Field(default=0, ge=-(1 << 63), lt=1 << 63)
    user: Text | None = None  # the tenant, unless the X-Tenant header names one
    return_token_ids: bool = False  # vLLM's extension: token ids in every choice
    n: int = Field(default=1, ge=1)  # only 1 is served

    def stop_strings(self) -> tuple[str, ...]:
        """`stop` as a tuple (a string is one stop string)."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        """A stream ends with a chunk that carries only the usage."""
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Every chunk carries the usage so far (vLLM: only together with include_usage)."""
        return self.include_usage and self.stream_options.continuous_usage_stats


class CompletionRequest(GenerationRequest):
    """The body of POST /v1/completions."""

    prompt: Text | list[int]
    # Accepted only at their no-op values; anything else is a clear 400.
    echo: bool = False
    logprobs: int | None = None


# What a union's error says instead of pydantic's one message per branch.
_UNION_MESSAGES = {
    "prompt": "prompt: must be a string or a non-empty list of integer token ids",
    "stop": f"stop: must be a string or a list of at most {MAX_STOP_STRINGS} strings",
}
Body = TypeVar("Body", bound=GenerationRequest)


def validate_body(data: dict[str, Any], model: type[Body]) -> Body:
    """`data` as `model`, then the checks both endpoints share; ApiError(400) names the field."""
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None
    if body.n > 1:
        raise ApiError(400, f"n > 1 is not supported (got n={body.n})", param="n")
    if body.stream_options is not None and not body.stream:  # vLLM refuses it too
        raise ApiError(400, "stream_options: allowed only when stream is true",
                       param="stream_options")
    _check_stop(body.stop_strings())
    return body


def _first_error(exc: ValidationError) -> ApiError:
    """A 400 naming the field of the first error (our own checks' errors before type errors)."""
    errors = exc.errors()
    first = next((e for e in errors if e["type"] == "value_error"), errors[0])
    # A union adds its branch ("function-after[...]", "list[int]") to the path: not a field.
    loc = [str(part) for part in first["loc"] if "[" not in str(part)]
    param = loc[0] if loc else None
    message = f"{'.'.join(loc)}: {first['msg'].removeprefix('Value error, ')}"
    if param in _UNION_MESSAGES and first["type"] not in ("missing", "value_error"):
        message = _UNION_MESSAGES[param]
    return ApiError(400, message, param=param)


def _check_stop(stops: tuple[str, ...]) -> None:
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, _UNION_MESSAGES["stop"] + f", got {len(stops)}", param="stop")
    for stop in stops:
        if not stop or len(stop) > MAX_STOP_CHARS:
            raise ApiError(400, f"stop: each stop string must have 1 to {MAX_STOP_CHARS} "
                           f"characters, got {len(stop)}", param="stop")


_UNSUPPORTED = (("echo", False), ("logprobs", None))


def parse_completion(data: dict[str, Any]) -> CompletionRequest:
    """Validate a /v1/completions body (from parse_json); ApiError(400) names the first bad
    field."""
    body = validate_body(data, CompletionRequest)
    for field, allowed in _UNSUPPORTED:
        if getattr(body, field) != allowed:
            raise ApiError(400, f"{field}={getattr(body, field)!r} is not supported", param=field)
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


def usage_chunk(request_id: str, object_: str, created: int, model: str,
                usage: dict[str, Any]) -> dict[str, Any]:
    """The last chunk of a stream that asked for include_usage: no choices, just usage."""
    return {"id": request_id, "object": object_, "created": created, "model": model,
            "choices": [], "usage": usage}


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def header_text(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value as the client wrote it: UTF-8 where its bytes are UTF-8 (Starlette
    decodes every header as latin-1, which would store `тенант` as mojibake), else latin-1."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        return value
