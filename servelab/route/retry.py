"""When `servelab route` tries a request again: each try's deadline, the client's total budget,
and a retry budget that keeps retries from multiplying the load when every upstream is sick
(Envoy's per-try timeout, route timeout and retry budget).

Only a request whose client has received no byte is tried again: a completion has no side
effects, so a duplicate costs compute only, while a stream that has sent tokens cannot be
replayed without the client seeing them twice.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryConfig:
    """How long one try may take, how long a request may take, and how often to try again."""

    retries: int = 2  # further tries after a sent request failed (refused connections aside)
    per_try_timeout_s: float | None = None  # a fixed per-try deadline; None: derived below
    per_try_floor_s: float = 10.0  # the derived deadline's least value (queueing, prefill)
    tpot_headroom: float = 4.0  # derived deadline: headroom x max_tokens x the upstream's TPOT
    assumed_tpot_s: float = 0.1  # an upstream's TPOT until its /metrics shows one
    request_timeout_s: float = 600.0  # the client's total budget, every try included
    budget_ratio: float = 0.2  # retries allowed per request received within the window
    budget_min: int = 10  # retries allowed within the window however few requests came
    budget_window_s: float = 10.0  # what "recent" means for the retry budget

    def __post_init__(self) -> None:
        if self.retries < 0 or self.budget_min < 0:
            raise ValueError(f"route: retries ({self.retries}) and budget_min "
                             f"({self.budget_min}) must be >= 0")
        if self.per_try_timeout_s is not None and not self.per_try_timeout_s > 0:
            raise ValueError(f"route: per_try_timeout_s must be > 0, got {self.per_try_timeout_s}")
        for key in ("per_try_floor_s", "tpot_headroom", "assumed_tpot_s", "request_timeout_s",
                    "budget_window_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"route: {key} must be > 0, got {getattr(self, key)}")
        if not self.budget_ratio >= 0:
            raise ValueError(f"route: budget_ratio must be >= 0, got {self.budget_ratio}")

    def per_try_s(self, max_tokens: int, tpot_s: float | None) -> float:
        """One try's deadline: the fixed one, else headroom x max_tokens x TPOT, floored."""
        if self.per_try_timeout_s is not None:
            return self.per_try_timeout_s
        tpot = self.assumed_tpot_s if tpot_s is None else tpot_s
        return max(self.per_try_floor_s, self.tpot_headroom * max_tokens * tpot)


class RetryBudget:
    """Retries allowed within the last window: at least `budget_min`, else `budget_ratio` of
    the requests received. With every upstream failing, retries stay a share of the load
    instead of tripling it."""

    def __init__(self, config: RetryConfig) -> None:
        self.config = config
        self._requests: deque[float] = deque()  # arrival times within the window
        self._retries: deque[float] = deque()  # times retries were granted within it

    def request(self, now: float) -> None:
        """Count a request received."""
        self._requests.append(now)

    def allow(self, now: float) -> bool:
        """Grant a retry (and count it) if the budget has room for one now."""
        cfg = self.config
        for times in (self._requests, self._retries):
            while times and times[0] <= now - cfg.budget_window_s:
                times.popleft()
        if len(self._retries) >= max(cfg.budget_min, cfg.budget_ratio * len(self._requests)):
            return False
        self._retries.append(now)
        return True


async def sleep_until(clock: Callable[[], float], until: float, step_s: float) -> None:
    """Return once `clock()` reaches `until`, looking at least every step_s seconds (a clock
    that a test moves needs looking at; the monotonic clock needs one sleep)."""
    while (left := until - clock()) > 0:
        await asyncio.sleep(min(left, step_s))
