"""The load client's HTTP sessions: a keep-alive pool that lets go of idle connections before
a server would, and one more try, on a new connection, for a request that never reached the
server (a pooled connection the server had closed, or none opened at all); and what the
client asks a server besides completions: its model card, its preemption count."""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class BenchConfig:
    """Where to send and the bounds of one run."""

    url: str  # the server's base URL, e.g. http://127.0.0.1:8000
    model: str | None = None  # None: the first model the server lists
    api_key: str | None = None
    max_concurrency: int | None = None  # most requests in flight; None: no limit
    timeout_s: float = 3600.0  # the whole run; requests unfinished by then count as failed
    request_timeout_s: float = 600.0  # one request, between bytes
    # How long an idle pooled connection is reused: under the 5 s after which uvicorn (and so
    # vLLM) closes one, so a request is not written into a connection the server just closed.
    keepalive_timeout_s: float = 4.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        for key in ("timeout_s", "request_timeout_s", "keepalive_timeout_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)}")


def make_client(config: BenchConfig, pooled: bool = True) -> aiohttp.ClientSession:
    """An HTTP session on the server's base URL, without proxies and without a pool cap;
    `pooled=False`: every request on a new connection (the retries')."""
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0,
                                    sock_read=config.request_timeout_s)
    connector = (aiohttp.TCPConnector(limit=config.max_concurrency or 0,
                                      keepalive_timeout=config.keepalive_timeout_s)
                 if pooled else aiohttp.TCPConnector(limit=0, force_close=True))
    tracing = aiohttp.TraceConfig()
    tracing.on_connection_reuseconn.append(_mark_reused)
    tracing.on_request_chunk_sent.append(_mark_sent)
    return aiohttp.ClientSession(
        base_url=config.url.rstrip("/") + "/", headers=headers, timeout=timeout,
        connector=connector, trust_env=False, trace_configs=[tracing])


@dataclass
class _Attempt:
    """One try of a request: whether it went out on a pooled connection, and what to call
    once its body was written to the connection (trace hooks do both)."""

    reused: bool = False
    on_sent: Callable[[], None] | None = None


async def _mark_reused(_session: aiohttp.ClientSession, context: SimpleNamespace,
                       _params: aiohttp.TraceConnectionReuseconnParams) -> None:
    if isinstance(context.trace_request_ctx, _Attempt):
        context.trace_request_ctx.reused = True


async def _mark_sent(_session: aiohttp.ClientSession, context: SimpleNamespace,
                     _params: aiohttp.TraceRequestChunkSentParams) -> None:
    attempt = context.trace_request_ctx
    if isinstance(attempt, _Attempt) and attempt.on_sent is not None:
        attempt.on_sent()


def never_reached_server(exc: BaseException, reused: bool) -> bool:
    """Whether a request that raised `exc` before its response began cannot have reached the
    server: no connection could be opened, or a pooled one turned out closed by the server
    (closed or reset before a single response byte: its idle timeout crossed our write).

    A fresh connection closed without an answer is the server's doing (it may have started
    the request), and so is anything after a byte of the response: neither is sent again.
    A pooled connection closed without a byte is taken for the idle close it nearly always
    is; a server that read a request there and then died before answering would see it twice.
    """
    if isinstance(exc, aiohttp.ClientSSLError):
        return False  # a certificate does not change on a second try
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):
        return True
    if not reused:
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        # aiohttp puts the part of a response it had parsed in `message`, else a string.
        return isinstance(exc.message, str)
    return (isinstance(exc, aiohttp.ClientOSError)
            and exc.errno in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED))


async def post_once_more_if_unsent(client: aiohttp.ClientSession,
                                   fresh: aiohttp.ClientSession, path: str,
                                   payload: dict | bytes,
                                   on_sent: Callable[[], None] | None = None
                                   ) -> tuple[aiohttp.ClientResponse, bool]:
    """POST `payload` (a JSON object, or one already encoded) on the pool, and if that try
    never reached the server (never_reached_server), once more on a new connection
    (`fresh`, a session that never pools: a second stale connection cannot be picked); the
    response (status and headers read) and whether it took the second try. Like HTTP
    clients that retry a request on a reused connection only when nothing of it was
    processed (RFC 9112 9.3.1.1), never twice. `on_sent` is called each time a try's body
    has been written to its connection (sessions from make_client only)."""
    body = ({"data": payload, "headers": JSON_CONTENT} if isinstance(payload, bytes)
            else {"json": payload})
    attempt = _Attempt(on_sent=on_sent)
    try:
        return await client.post(path, **body, trace_request_ctx=attempt), False
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        if not never_reached_server(exc, attempt.reused):
            raise
    return await fresh.post(path, **body, trace_request_ctx=_Attempt(on_sent=on_sent)), True


JSON_CONTENT = {"Content-Type": "application/json"}


def encode_json(payload: dict) -> bytes:
    """A request body as aiohttp's `json=` would send it (json.dumps, UTF-8)."""
    return json.dumps(payload).encode()


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


# The server counters a run reads before and after itself (vLLM's names).
COUNTERS = ("vllm:num_preemptions_total", "vllm:prefix_cache_hits_total",
            "vllm:prefix_cache_queries_total")


async def scrape_counters(client: aiohttp.ClientSession) -> dict[str, float]:
    """The COUNTERS the server's /metrics exposes (summed over labels); {} if none."""
    try:
        async with client.get("metrics") as response:
            if response.status != 200:
                return {}
            text = await response.text()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return {}
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in COUNTERS:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals
