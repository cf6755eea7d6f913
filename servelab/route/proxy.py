"""The router's request path: pick an upstream in rotation with sim.cluster.router, forward the body
and headers unchanged, and relay the answer (servelab/route/relay.py).

Until the client has received a byte, a request may go elsewhere: a refused connection
(nothing was sent) always, and a try that failed, answered 5xx or garbage, outlived its
per-try deadline, or whose upstream was ejected meanwhile, up to `retries` times within the
retry budget (servelab/route/retry.py). A try runs as servelab/route/attempt.py says: a
non-streamed answer is read whole and a stream up to its first event before the client sees
anything, and every abandoned try closes its upstream connection, which is how a vLLM-style
server learns to abort the request. Every outcome feeds the upstream's health
(servelab/route/health.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from fastapi import Request as HttpRequest
from fastapi.responses import Response
from multidict import CIMultiDict

from servelab.route.attempt import TRANSPORT_ERRORS, Answer, Failure, Try, attempt
from servelab.route.prefix import (
    PromptBlocks,
    kv_tokens_estimate,
    max_tokens_of,
    prompt_blocks,
)
from servelab.route.relay import (
    HOP_HEADERS,
    bad_gateway,
    client_gone,
    discard,
    relay,
    with_upstream_headers,
)
from servelab.route.state import RouteState
from servelab.route.upstreams import (
    CONNECT_ERRORS,
    Upstream,
    request_failed,
    request_succeeded,
)
from servelab.serve.api import check_bearer, parse_body
from servelab.serve.completions import read_body
from servelab.serve.protocol import ApiError


@dataclass(frozen=True)
class Routed:
    """A client's request as every try sends it."""

    path: str
    raw: bytes  # the body as the client sent it
    headers: CIMultiDict[str]  # the client's end-to-end headers
    blocks: PromptBlocks | None  # the prompt's prefix keys (prefix-aware routing only)
    kv_tokens: int  # prompt + max_tokens estimate (load-aware routing only, else 0)
    max_tokens: int  # the per-try deadline grows with it
    streamed: bool


def authorize(state: RouteState, http: HttpRequest) -> None:
    """401 unless the client sent the router's key (when it has one)."""
    key = state.config.api_key
    check_bearer(http.headers.get("authorization", ""), key.encode("utf-8") if key else None)


def forwarded_headers(http: HttpRequest) -> CIMultiDict[str]:
    """The client's end-to-end headers, repeats kept, each UTF-8 value as the bytes sent.

    Starlette decodes header bytes as latin-1 and aiohttp encodes str values as UTF-8, so a
    value is decoded as UTF-8 here to reach the upstream unchanged. A value that is not
    UTF-8 cannot pass through aiohttp unchanged; it goes as its latin-1 reading (so the
    upstream answers it as it would a direct request, only with those bytes re-encoded)."""
    headers: CIMultiDict[str] = CIMultiDict()
    for raw_name, raw_value in http.scope["headers"]:
        name = raw_name.decode("latin-1").lower()
        if name in HOP_HEADERS:
            continue
        try:
            headers.add(name, raw_value.decode("utf-8"))
        except UnicodeDecodeError:
            headers.add(name, raw_value.decode("latin-1"))
    return headers


def pick_upstream(state: RouteState, blocks: PromptBlocks | None,
                  tried: tuple[Upstream, ...] = ()) -> Upstream | None:
    """The router's choice among the upstreams in rotation (all of them if none is: a
    panic, as Envoy routes to every host when too few are healthy), less those already
    `tried`; None if nothing is left."""
    now = state.clock()
    others = [u for u in state.upstreams if u not in tried]
    candidates = [u for u in others if u.routable(now)] or others
    if not candidates:
        return None
    router = state.router
    prompt_len = max(blocks.prompt_len, 1) if blocks is not None else 1
    if not router.needs_loads:
        return candidates[router.choose(prompt_len, len(candidates))]
    runs = [0] * len(state.upstreams)
    if blocks is not None:
        runs = state.index.matched_blocks(blocks.keys, len(state.upstreams))
    block_len = blocks.block_len if blocks is not None else 0
    loads = [u.load(runs[u.index] * block_len) for u in candidates]
    return candidates[router.choose(prompt_len, loads)]


async def forward(state: RouteState, http: HttpRequest, path: str) -> Response:
    """POST `path` to the chosen upstream (elsewhere while the client has seen nothing and
    the try failed) and relay the answer."""
    authorize(state, http)
    raw = await read_body(http, state.config.max_body_bytes)
    body = parse_body(path, raw)  # refused here as the upstream would; forwarded as sent
    blocks = None
    if state.router.needs_prefix:
        blocks = prompt_blocks(body, state.config.prefix_block_tokens)
    kv_tokens = kv_tokens_estimate(body) if state.router.needs_loads else 0
    routed = Routed(path, raw, forwarded_headers(http), blocks, kv_tokens,
                    max_tokens_of(body), body.get("stream") is True)
    return await _send(state, http, routed)


async def _send(state: RouteState, http: HttpRequest, req: Routed) -> Response:
    """Try upstreams until one answers below 500 (or no retry is left), then relay."""
    start = state.clock()
    until = start + state.config.retry.request_timeout_s  # the client's total budget
    state.budget.request(start)
    tried: list[Upstream] = []
    kinds: list[str] = []  # why each try failed
    upstream = pick_upstream(state, req.blocks)
    while upstream is not None:
        tried.append(upstream)
        retries_left = state.config.retry.retries - sum(k != "connect" for k in kinds)
        t = _try(state, req, upstream, until, tried, retries_left)
        outcome = await attempt(state, http, t)
        if outcome is None:
            return client_gone()
        if isinstance(outcome, Answer):
            _count_answer(state, upstream, outcome.response.status)
            if outcome.response.status < 500:
                if req.blocks is not None and outcome.response.status == 200:
                    state.index.record(req.blocks.keys, upstream.index)
                return relay(state, upstream, outcome, until)
            kinds.append("http_5xx")
        else:
            _count_failure(state, upstream, outcome, t, until)
            kinds.append(outcome.kind)
        nxt, denied = _next_upstream(state, req, tried, kinds, until)
        if nxt is None:
            return _give_up(state, upstream, outcome, kinds, denied, until)
        if isinstance(outcome, Answer):
            discard(upstream, outcome)
        state.metrics.retries.labels(upstream.url, kinds[-1]).inc()
        upstream = nxt
    raise bad_gateway("no upstream to send the request to")


def _try(state: RouteState, req: Routed, upstream: Upstream, until: float,
         tried: list[Upstream], retries_left: int) -> Try:
    """The next try at `upstream`: its deadline follows max_tokens and the upstream's TPOT
    (a stream's first event also within first_byte_timeout_s), within the total budget."""
    cfg = state.config
    limit_s = cfg.retry.per_try_s(req.max_tokens, upstream.tpot_s)
    if req.streamed:
        limit_s = min(limit_s, cfg.first_byte_timeout_s)
    deadline = min(state.clock() + limit_s, until)

    def can_move() -> bool:  # a retry left, and an upstream in rotation not tried yet
        now = state.clock()
        return retries_left > 0 and any(u.routable(now) for u in state.upstreams
                                        if u is not upstream and u not in tried)

    return Try(upstream, f"{upstream.url}{req.path}", req.raw, req.headers, req.streamed,
               req.kv_tokens, deadline, min(limit_s, until - state.clock()), can_move)


def _next_upstream(state: RouteState, req: Routed, tried: list[Upstream], kinds: list[str],
                   until: float) -> tuple[Upstream | None, str]:
    """Where the request goes next, or None and why not. A refused connection sent nothing,
    so it needs neither a retry nor room in the budget; the rest need both."""
    now, sent = state.clock(), kinds[-1] != "connect"
    retries = sum(kind != "connect" for kind in kinds[:-1])  # tries that followed a sent one
    denied = ""
    if now >= until:
        denied = "deadline"
    elif sent and retries >= state.config.retry.retries:
        denied = "retries"
    nxt = None if denied else pick_upstream(state, req.blocks, tuple(tried))
    if not denied and nxt is None:
        denied = "upstreams"
    if nxt is not None and sent and not state.budget.allow(now):
        nxt, denied = None, "budget"
    if denied:
        state.metrics.retries_denied.labels(denied).inc()
    return nxt, denied


_DENIED = {"deadline": "the request's time budget is spent", "retries": "no retry left",
           "upstreams": "no other upstream left", "budget": "the retry budget is spent"}


def _give_up(state: RouteState, upstream: Upstream, outcome: Answer | Failure,
             kinds: list[str], denied: str, until: float) -> Response:
    """The last try's answer (a 5xx passes through as the upstream sent it), or its error."""
    if isinstance(outcome, Answer):
        return relay(state, upstream, outcome, until)
    tries = f"{len(kinds)} tries" if len(kinds) > 1 else "1 try"
    message = f"{outcome.message} (after {tries}; {_DENIED[denied]})"
    if set(kinds) == {"connect"}:
        raise bad_gateway(f"no upstream accepted the connection: {message}")
    if outcome.kind == "timeout":
        raise ApiError(504, message, type_="server_error", code="gateway_timeout")
    raise bad_gateway(message)


def _count_failure(state: RouteState, upstream: Upstream, failure: Failure, t: Try,
                   until: float) -> None:
    """A failed try against its upstream's health. An ejection is no new failure, nor is a
    try cut short by the request's total budget rather than its own deadline."""
    now = state.clock()
    if failure.kind == "connect":
        upstream.set_reachable(False, failure.message)
    elif failure.kind == "ejected" or (failure.kind == "timeout" and t.deadline >= until):
        return
    kind = failure.kind
    if kind == "timeout":
        kind = "first_byte_timeout" if t.streamed else "per_try_timeout"
    request_failed(upstream, state.metrics, now, kind, failure.message)


def _count_answer(state: RouteState, upstream: Upstream, status: int) -> None:
    """An answer is a success for the upstream's health unless it is a 5xx."""
    state.metrics.requests.labels(upstream.url).inc()
    upstream.set_reachable(True)
    if status >= 500:
        request_failed(upstream, state.metrics, state.clock(), "http_5xx", f"HTTP {status}")
    else:
        request_succeeded(upstream, state.clock())


async def fetch_models(state: RouteState, http: HttpRequest) -> Response:
    """GET /v1/models from the first upstream that answers (those in rotation first)."""
    authorize(state, http)
    headers = forwarded_headers(http)
    timeout = aiohttp.ClientTimeout(total=state.config.connect_timeout_s + 5.0)
    now = state.clock()
    for upstream in sorted(state.upstreams, key=lambda u: not u.routable(now)):
        try:
            async with state.session.get(f"{upstream.url}/v1/models", headers=headers,
                                         timeout=timeout) as response:
                if response.status < 500:
                    return with_upstream_headers(Response(await response.read(),
                                                          response.status), response)
        except CONNECT_ERRORS as exc:
            upstream.set_reachable(False, str(exc))
        except TRANSPORT_ERRORS:
            continue
    raise bad_gateway("no upstream answered GET /v1/models")
