"""The router's view of each upstream: its load from /metrics, what the router has in flight
there, whether it answers, and the router's own Prometheus metrics about all of that.

A poll reads vLLM's gauges (running, waiting, KV usage) and its KV pool size; between polls
the requests the router sent since the last reading and still has in flight count as
waiting there, and their tokens as used KV, so a burst spreads out instead of following one
stale reading. Everything here runs on the router's event loop, so it needs no locks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from servelab.route.health import Health, HealthConfig
from servelab.serve.metrics import CACHE_INFO
from sim.cluster.router import ReplicaLoad

if TYPE_CHECKING:
    from servelab.route.metrics import RouteMetrics

log = logging.getLogger(__name__)

# vLLM's gauge names; vLLM before v0.10 called the KV one vllm:gpu_cache_usage_perc.
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# vLLM's histogram of the gaps between a request's tokens (its older name second).
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
# What aiohttp raises when no connection could be made (the request never left the router).
CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)


@dataclass(frozen=True)
class Reading:
    """One poll of an upstream's /metrics."""

    load: ReplicaLoad  # running, waiting, KV usage (cached_tokens unused)
    kv_pool_tokens: int | None = None  # block_size x num_gpu_blocks; None if not published
    itl_sum_s: float = 0.0  # the ITL histogram's sum since the upstream started, seconds
    itl_count: int = 0  # and its count of gaps (0: not published, or no token yet)


@dataclass(frozen=True)
class Ticket:
    """A request the router sent: the reading it was sent after, and its KV estimate."""

    epoch: int  # the upstream's reading count when it was sent
    kv_tokens: int  # prompt + max_tokens, in (estimated) tokens


@dataclass(slots=True)
class Upstream:
    """One upstream server and the router's running record of it."""

    url: str  # base URL, no trailing slash
    index: int  # position in the router's list (the prefix index's bit)
    polled: Reading | None = None  # the last /metrics reading; None: none, or failing
    metrics_error: str | None = None  # why the last poll failed (logged once per streak)
    reachable: bool = True  # False after a refused connection, until one succeeds
    in_flight: int = 0  # requests sent and not yet finished
    fresh: int = 0  # of those, sent since the last reading (the reading cannot know them)
    fresh_kv_tokens: int = 0  # their KV estimates, summed
    epoch: int = 0  # readings so far
    health: Health = field(default_factory=lambda: Health(HealthConfig()))
    tpot_s: float | None = None  # mean gap between tokens lately; None until one is read
    itl_seen: tuple[float, int] = (0.0, 0)  # the ITL histogram's sum and count last read
    # One event per try sent here and not yet answered: set when the upstream is ejected,
    # so that the try gives up and the request goes elsewhere.
    unanswered: set[asyncio.Event] = field(default_factory=set)

    def routable(self, now: float) -> bool:
        """Neither refused at the last connection nor ejected."""
        return self.reachable and self.health.routable(now)

    def load(self, cached_tokens: int = 0) -> ReplicaLoad:
        """The snapshot a router sees: the last reading plus what was sent since it; without
        a reading, the router's own in-flight count only."""
        if self.polled is None:
            return ReplicaLoad(self.in_flight, 0, 0.0, cached_tokens)
        load, pool = self.polled.load, self.polled.kv_pool_tokens
        kv_usage = load.kv_usage + (self.fresh_kv_tokens / pool if pool else 0.0)
        return ReplicaLoad(load.num_running, load.num_waiting + self.fresh,
                           min(kv_usage, 1.0), cached_tokens)

    def begin(self, kv_tokens: int = 0) -> Ticket:
        """Count a request as sent; hand the ticket back to `end`."""
        self.in_flight += 1
        self.fresh += 1
        self.fresh_kv_tokens += kv_tokens
        return Ticket(self.epoch, kv_tokens)

    def end(self, ticket: Ticket) -> None:
        """Count a request as finished."""
        self.in_flight -= 1
        if ticket.epoch == self.epoch:  # else a reading since has replaced the estimate
            self.fresh -= 1
            self.fresh_kv_tokens -= ticket.kv_tokens

    def take_reading(self, reading: Reading | None, error: str | None) -> None:
        """A poll's result: a reading (requests sent before it are in it), or an error."""
        if error is not None and self.metrics_error is None:
            log.warning("upstream %s: /metrics unusable (%s); counting only the router's "
                        "in-flight requests there until it recovers", self.url, error)
        elif error is None and self.metrics_error is not None:
            log.warning("upstream %s: /metrics readable again", self.url)
        self.metrics_error = error
        self.polled = reading
        self.epoch += 1
        self.fresh = self.fresh_kv_tokens = 0
        if reading is not None and reading.itl_count > 0:
            self._note_itl(reading.itl_sum_s, reading.itl_count)

    def _note_itl(self, sum_s: float, count: int) -> None:
        """TPOT from the ITL histogram: the mean gap since the last reading (all of them at
        the first reading, or after the upstream restarted and its count went back)."""
        seen_s, seen = self.itl_seen
        if count > seen:
            self.tpot_s = (sum_s - seen_s) / (count - seen)
        elif count < seen:
            self.tpot_s = sum_s / count
        self.itl_seen = (sum_s, count)

    def set_reachable(self, reachable: bool, reason: str = "") -> None:
        """Record whether a connection to it just succeeded (logs the changes only)."""
        if self.reachable and not reachable:
            log.warning("upstream %s: unreachable (%s)", self.url, reason)
        elif reachable and not self.reachable:
            log.warning("upstream %s: reachable again", self.url)
        self.reachable = reachable


def parse_reading(text: str) -> Reading:
    """Running, waiting and KV usage from a Prometheus text exposition (summed over label
    sets such as vLLM's engines; KV usage averaged), and the KV pool if published;
    ValueError if the request gauges are missing."""
    sums = {RUNNING: 0.0, WAITING: 0.0}
    kv: list[float] = []
    seen, pool = set(), 0
    itl = {f"{name}{part}": 0.0 for name in ITL for part in ("_sum", "_count")}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in itl:
                itl[sample.name] += sample.value
            elif sample.name in sums:
                sums[sample.name] += sample.value
                seen.add(sample.name)
            elif sample.name in KV_USAGE:
                kv.append(sample.value)
            elif sample.name == CACHE_INFO:
                pool += _pool_tokens(sample.labels)
    if len(seen) < 2:
        raise ValueError(f"no {RUNNING} / {WAITING} gauges")
    usage = min(max(sum(kv) / len(kv), 0.0), 1.0) if kv else 0.0
    load = ReplicaLoad(int(sums[RUNNING]), int(sums[WAITING]), usage)
    name = next((n for n in ITL if itl[f"{n}_count"] > 0), ITL[0])  # the one published
    return Reading(load, pool or None, itl[f"{name}_sum"], int(itl[f"{name}_count"]))


def _pool_tokens(labels: dict[str, str]) -> int:
    """Tokens of KV one vllm:cache_config_info sample describes (0 if it does not say)."""
    try:
        return int(labels["block_size"]) * int(labels["num_gpu_blocks"])
    except (KeyError, ValueError):  # vLLM publishes num_gpu_blocks="None" before profiling
        return 0


async def poll(session: aiohttp.ClientSession, upstream: Upstream, timeout_s: float) -> None:
    """Read one upstream's /metrics into its record."""
    try:
        async with session.get(f"{upstream.url}/metrics",
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}")
            text = await response.text()
        upstream.set_reachable(True)
        reading = parse_reading(text)
    except CONNECT_ERRORS as exc:
        upstream.set_reachable(False, str(exc))
        upstream.take_reading(None, f"{type(exc).__name__}: {exc}")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        upstream.take_reading(None, f"{type(exc).__name__}: {exc}")
    else:
        upstream.take_reading(reading, None)


async def poll_forever(session: aiohttp.ClientSession, upstreams: list[Upstream],
                       interval_s: float) -> None:
    """Poll every upstream every interval_s seconds (all at once), until cancelled."""
    timeout_s = max(interval_s, 1.0)  # a slow /metrics still counts if it answers in time
    while True:
        await asyncio.sleep(interval_s)
        await asyncio.gather(*(poll(session, u, timeout_s) for u in upstreams))


async def check(session: aiohttp.ClientSession, upstream: Upstream, metrics: RouteMetrics,
                clock: Callable[[], float]) -> None:
    """One active health check: GET the check path; 200 within the timeout passes."""
    cfg = upstream.health.config
    try:
        async with session.get(f"{upstream.url}{cfg.check_path}",
                               timeout=aiohttp.ClientTimeout(total=cfg.check_timeout_s)) as r:
            await r.read()
        upstream.set_reachable(True)
        failure = None if r.status == 200 else f"health check: HTTP {r.status}"
    except CONNECT_ERRORS as exc:
        upstream.set_reachable(False, str(exc))
        failure = f"health check: {type(exc).__name__}: {exc}"
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        failure = f"health check: {type(exc).__name__}: {exc}"
        if isinstance(exc, asyncio.TimeoutError):
            failure = f"health check: no answer within {cfg.check_timeout_s} s"
    metrics.health_checks.labels(upstream.url, "pass" if failure is None else "fail").inc()
    if failure is None:
        was = upstream.health.state(clock())
        upstream.health.check_passed(clock())
        if was != "healthy" and upstream.health.ejected_until is None:
            log.warning("upstream %s: back in rotation (health check passed)", upstream.url)
    elif upstream.health.check_failed(clock(), failure):
        ejected(upstream, metrics, clock())


async def check_forever(session: aiohttp.ClientSession, upstream: Upstream,
                        metrics: RouteMetrics, clock: Callable[[], float]) -> None:
    """Check one upstream every check_interval_s (each on its own, so one that hangs
    delays no other's checks), until cancelled."""
    while True:
        await asyncio.sleep(upstream.health.config.check_interval_s)
        await check(session, upstream, metrics, clock)


def request_failed(upstream: Upstream, metrics: RouteMetrics, now: float, kind: str,
                   reason: str) -> None:
    """Count a failed request against the upstream (metrics, then outlier ejection)."""
    metrics.errors.labels(upstream.url, kind).inc()
    if upstream.health.request_failed(now, f"{kind}: {reason}"):
        ejected(upstream, metrics, now)


def request_succeeded(upstream: Upstream, now: float) -> None:
    """Count an answer below 500 for the upstream."""
    was_out = upstream.health.ejected_until is not None
    upstream.health.request_succeeded(now)
    if was_out and upstream.health.ejected_until is None:
        log.warning("upstream %s: back in rotation (a request succeeded)", upstream.url)


def ejected(upstream: Upstream, metrics: RouteMetrics, now: float) -> None:
    """Log and count an ejection that just happened; the tries waiting there give up."""
    health = upstream.health
    metrics.ejections.labels(upstream.url).inc()
    log.warning("upstream %s: ejected for %.1f s (ejection %d; %s; %d tries waiting there "
                "go elsewhere)", upstream.url, health.ejected_until - now, health.ejections,
                health.last_failure, len(upstream.unanswered))
    for event in upstream.unanswered:
        event.set()
