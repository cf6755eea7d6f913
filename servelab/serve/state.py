"""What the HTTP handlers share: the configuration, the engine thread and its companions."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from servelab.serve.engine_thread import EngineThread
from servelab.serve.metrics import ServerMetrics
from servelab.serve.request_log import RequestLog
from servelab.serve.tokenizer import Tokenizer


@dataclass(frozen=True)
class ApiConfig:
    """The HTTP side's settings."""

    model_name: str
    max_model_len: int  # prompt + max_tokens limit
    api_key: str | None = None  # required as `Authorization: Bearer KEY` on /v1/* when set
    max_body_bytes: int = 1 << 20  # larger request bodies get 413
    retry_after_s: int = 1  # the Retry-After of a 503
    durable_wait_s: float = 5.0  # longest a response waits for its log row to commit
    seed: int = 0  # draws the sampling seed of requests that give none

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        for key in ("max_model_len", "max_body_bytes", "retry_after_s"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.api_key is not None:
            check_api_key(self.api_key)
        if not self.durable_wait_s > 0:
            raise ValueError(f"durable_wait_s must be > 0, got {self.durable_wait_s}")


def check_api_key(key: str) -> None:
    """ValueError unless key can travel in an `Authorization: Bearer` header unchanged."""
    if not key:
        raise ValueError("api_key must not be empty (omit it to disable auth)")
    # Control characters cannot be sent in a header, and HTTP strips the whitespace around a
    # value. Non-ASCII is allowed: the server compares UTF-8 bytes, clients send UTF-8.
    bad = next((i for i, char in enumerate(key) if not char.isprintable()), None)
    if bad is not None:
        raise ValueError(f"api_key: character U+{ord(key[bad]):04X} at index {bad} is not "
                         "printable; a key must be printable characters only")
    if key != key.strip():
        raise ValueError("api_key must not begin or end with a space (HTTP strips it)")


@dataclass
class ServeState:
    """The server's parts; only the engine thread mutates the scheduler behind `engine`."""

    config: ApiConfig
    engine: EngineThread
    tokenizer: Tokenizer
    metrics: ServerMetrics
    vocab_size: int  # the model's: token ids must be below it
    request_log: RequestLog | None = None
    _ids: itertools.count = field(default_factory=itertools.count)
    _rng: np.random.Generator | None = None

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.config.seed)

    def next_request_id(self) -> str:
        """A unique id, also across restarts: the server's start time in ms and a counter."""
        start_ms = int(self.engine.clock.start_unix * 1000)
        return f"cmpl-{start_ms:x}-{next(self._ids)}"

    def next_seed(self) -> int:
        """A sampling seed for a request that gave none (event-loop thread only)."""
        return int(self._rng.integers(0, 1 << 62))
