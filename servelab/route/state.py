"""What `servelab route` is configured with, and the state its handlers share."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from servelab.route.health import Health, HealthConfig
from servelab.route.metrics import RouteMetrics
from servelab.route.prefix import PrefixIndex
from servelab.route.retry import RetryBudget, RetryConfig
from servelab.route.upstreams import Upstream
from sim.cluster.router import Router, RouterConfig


@dataclass(frozen=True)
class RouteConfig:
    """The upstreams, the routing policy and the limits of `servelab route`."""

    upstreams: tuple[str, ...]  # base URLs, e.g. http://127.0.0.1:8001
    router: RouterConfig = field(default_factory=RouterConfig)
    metrics_interval_s: float = 0.5  # how often each upstream's /metrics is read
    api_key: str | None = None  # required from clients as `Authorization: Bearer KEY`
    prefix_block_tokens: int = 16  # prefix index block, in tokens (text: x BYTES_PER_TOKEN)
    prefix_max_keys: int = 1 << 20  # prefix index entries kept (LRU)
    max_body_bytes: int = 1 << 24  # larger request bodies get 413 without being forwarded
    connect_timeout_s: float = 5.0  # a connection not made by then counts as refused
    read_timeout_s: float = 600.0  # longest silence of an upstream mid-response
    # A streamed try's bound on reaching its first event (connecting included), on top of
    # the per-try deadline. A non-streamed answer comes whole, bounded by the per-try
    # deadline alone, which grows with max_tokens: a long generation is not a sick upstream.
    first_byte_timeout_s: float = 60.0
    health: HealthConfig = field(default_factory=HealthConfig)  # checks and ejection
    retry: RetryConfig = field(default_factory=RetryConfig)  # deadlines and retries

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ValueError("route: give at least one upstream URL")
        for url in self.upstreams:
            if not url.startswith(("http://", "https://")) or url != url.rstrip("/"):
                raise ValueError(f"route: upstream {url!r} must be an http(s):// base URL "
                                 "without a trailing slash")
        if len(set(self.upstreams)) != len(self.upstreams):
            raise ValueError(f"route: upstreams repeat: {', '.join(self.upstreams)}")
        for key in ("metrics_interval_s", "connect_timeout_s", "read_timeout_s",
                    "first_byte_timeout_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"route: {key} must be > 0, got {getattr(self, key)}")
        for key in ("prefix_block_tokens", "prefix_max_keys", "max_body_bytes"):
            if getattr(self, key) < 1:
                raise ValueError(f"route: {key} must be >= 1, got {getattr(self, key)}")
        if not self.first_byte_timeout_s > self.connect_timeout_s:
            raise ValueError(f"route: first_byte_timeout_s ({self.first_byte_timeout_s}) must "
                             f"be > connect_timeout_s ({self.connect_timeout_s}), which it "
                             "includes")
        if self.api_key is not None and not self.api_key:
            raise ValueError("route: api_key must not be empty (omit it to disable auth)")


@dataclass
class RouteState:
    """What the handlers share; only the router's event loop touches it."""

    config: RouteConfig
    router: Router
    upstreams: list[Upstream]
    index: PrefixIndex
    metrics: RouteMetrics
    budget: RetryBudget
    session: aiohttp.ClientSession | None = None  # opened on the event loop, at startup
    # Seconds; health, back-offs, per-try deadlines and the request budget read it.
    clock: Callable[[], float] = time.monotonic
    # How often a deadline looks at the clock: a clock a test moves needs a short step.
    clock_step_s: float = math.inf

    @classmethod
    def create(cls, config: RouteConfig, clock: Callable[[], float] = time.monotonic,
               clock_step_s: float = math.inf) -> RouteState:
        """A fresh state: every upstream unread and in rotation, the prefix index empty."""
        upstreams = [Upstream(url, i, health=Health(config.health))
                     for i, url in enumerate(config.upstreams)]
        return cls(config, Router(config.router), upstreams, PrefixIndex(config.prefix_max_keys),
                   RouteMetrics(), RetryBudget(config.retry), clock=clock,
                   clock_step_s=clock_step_s)
