"""Upstream health for `servelab route`, as Envoy's outlier detection and active health
checks do it: consecutive request failures or failed checks eject an upstream for a back-off
that doubles with each ejection (capped); once the back-off is over, a passing health check
(or, in a panic when nothing else is left, a successful request) brings it back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthConfig:
    """How the router decides that an upstream is out of rotation, and for how long."""

    check_interval_s: float = 1.0  # GET check_path on every upstream this often; 0: no checks
    check_timeout_s: float = 2.0  # a check not answered 200 by then failed
    check_path: str = "/health"
    eject_after_failures: int = 3  # consecutive failed requests, or failed checks, that eject
    ejection_base_s: float = 2.0  # the first ejection's back-off; each next one doubles it
    ejection_max_s: float = 30.0  # the back-off's cap; this long back in rotation resets it

    def __post_init__(self) -> None:
        if not self.check_interval_s >= 0:
            raise ValueError(f"route: check_interval_s must be >= 0, got {self.check_interval_s}")
        for key in ("check_timeout_s", "ejection_base_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"route: {key} must be > 0, got {getattr(self, key)}")
        if not self.ejection_max_s >= self.ejection_base_s:
            raise ValueError(f"route: ejection_max_s ({self.ejection_max_s}) must be >= "
                             f"ejection_base_s ({self.ejection_base_s})")
        if self.eject_after_failures < 1:
            raise ValueError("route: eject_after_failures must be >= 1, got "
                             f"{self.eject_after_failures}")
        if not self.check_path.startswith("/"):
            raise ValueError(f"route: check_path must start with '/', got {self.check_path!r}")

    @property
    def checks_on(self) -> bool:
        return self.check_interval_s > 0


@dataclass(slots=True)
class Health:
    """One upstream's health record; `now` is the router's monotonic clock, in seconds.

    Request failures and check failures are counted apart (Envoy's outlier detection and
    active health checking): a server whose /health answers while its completions hang is
    still ejected by its requests."""

    config: HealthConfig
    request_failures: int = 0  # consecutive failed requests (reset by one that succeeds)
    check_failures: int = 0  # consecutive failed health checks (reset by one that passes)
    ejected_until: float | None = None  # None: in rotation; else out at least until then
    ejections: int = 0  # ejections since the upstream last stayed in rotation ejection_max_s
    restored_at: float | None = None  # when it last came back into rotation
    last_failure: str | None = None  # the reason of the latest failure, for /health

    def state(self, now: float) -> str:
        """healthy, ejected (back-off running) or probing (back-off over, not yet back)."""
        if self.ejected_until is None:
            return "healthy"
        return "ejected" if now < self.ejected_until else "probing"

    def routable(self, now: float) -> bool:
        """In rotation; without health checks, an upstream whose back-off is over is tried
        again with requests (the next failure ejects it again)."""
        if self.ejected_until is None:
            return True
        return not self.config.checks_on and now >= self.ejected_until

    def request_succeeded(self, now: float) -> None:
        self.request_failures = 0
        self._restore_if_due(now)

    def check_passed(self, now: float) -> None:
        self.check_failures = 0
        self._restore_if_due(now)

    def request_failed(self, now: float, reason: str) -> bool:
        """Count a failed request; True if this ejected the upstream."""
        self.request_failures += 1
        return self._failed(now, reason, self.request_failures)

    def check_failed(self, now: float, reason: str) -> bool:
        """Count a failed health check; True if this ejected the upstream."""
        self.check_failures += 1
        return self._failed(now, reason, self.check_failures)

    def _failed(self, now: float, reason: str, streak: int) -> bool:
        self.last_failure = reason
        if self.ejected_until is None:
            if streak < self.config.eject_after_failures:
                return False
        elif now < self.ejected_until:
            return False  # already out: failures of requests sent before do not extend it
        self._eject(now)  # in rotation with a long enough streak, or failed while probing
        return True

    def _eject(self, now: float) -> None:
        cfg = self.config
        if self.restored_at is not None and now - self.restored_at >= cfg.ejection_max_s:
            self.ejections = 0  # it stayed in rotation long enough: start the back-off over
        self.ejections += 1
        backoff_s = min(cfg.ejection_base_s * 2.0 ** (self.ejections - 1), cfg.ejection_max_s)
        self.ejected_until = now + backoff_s

    def _restore_if_due(self, now: float) -> None:
        """Back into rotation once the back-off is over (a success during it proves little:
        a server whose /health answers may still time out its completions)."""
        if self.ejected_until is not None and now >= self.ejected_until:
            self.ejected_until = None
            self.request_failures = self.check_failures = 0
            self.restored_at = now
