"""The router's own Prometheus metrics: what it sent where, what failed, and each upstream's
last reading and health."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from servelab.route.upstreams import RUNNING, WAITING, Upstream


class RouteMetrics:
    """The router's Prometheus metrics, on a registry of its own, labelled by upstream URL."""

    def __init__(self) -> None:
        self.registry = reg = CollectorRegistry()
        self.requests = Counter("servelab_router_requests", "Requests routed to an upstream.",
                                ["upstream"], registry=reg)
        self.errors = Counter("servelab_router_upstream_errors",
                              "Upstream failures: connect (refused or not connected in time, "
                              "never sent), first_byte_timeout (a stream's first event not in "
                              "time), per_try_timeout (a whole answer not in time), transport "
                              "(broken after sending), http_5xx (a 5xx answer), invalid (a "
                              "200 JSON answer that does not parse).",
                              ["upstream", "kind"], registry=reg)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["upstream"], registry=reg)

        self.in_flight = gauge("servelab_router_in_flight", "Requests in flight to an upstream.")
        self.running = gauge("servelab_router_upstream_running",
                             f"{RUNNING} at the last poll (-1: no reading).")
        self.waiting = gauge("servelab_router_upstream_waiting",
                             f"{WAITING} at the last poll (-1: no reading).")
        self.kv_usage = gauge("servelab_router_upstream_kv_usage_perc",
                              "KV-cache usage, 0 to 1, at the last poll (-1: no reading).")
        self.reachable = gauge("servelab_router_upstream_reachable",
                               "1 unless the last connection to the upstream was refused.")
        self.ejected = gauge("servelab_router_upstream_ejected",
                             "1 while the upstream is out of rotation (ejected, or its back-off "
                             "over and no health check passed since).")
        self.failures = gauge("servelab_router_upstream_consecutive_failures",
                              "Consecutive failed requests or health checks, the longer streak.")
        self.ejections = Counter("servelab_router_ejections",
                                 "Times the upstream was taken out of rotation.", ["upstream"],
                                 registry=reg)
        self.retries = Counter("servelab_router_retries",
                               "Requests sent on to another upstream after this one, by reason: "
                               "connect (never sent), timeout (no answer within the per-try "
                               "deadline), transport, http_5xx, invalid (an answer that does "
                               "not parse), ejected (the upstream was ejected meanwhile).",
                               ["upstream", "reason"], registry=reg)
        self.retries_denied = Counter("servelab_router_retries_denied",
                                      "Failed requests not tried again, by reason: retries "
                                      "(--retries used up), budget (the retry budget spent), "
                                      "deadline (the request's total budget spent), upstreams "
                                      "(no other upstream left).", ["reason"], registry=reg)
        self.health_checks = Counter("servelab_router_health_checks",
                                     "Active health checks, by result (pass, fail).",
                                     ["upstream", "result"], registry=reg)
        self.prefix_keys = Gauge("servelab_router_prefix_index_keys",
                                 "Block keys in the prefix-aware router's index.", registry=reg)

    def render(self, upstreams: list[Upstream], prefix_keys: int, now: float) -> bytes:
        """The text exposition, with the gauges set from the upstreams' records now."""
        for u in upstreams:
            polled = u.polled.load if u.polled is not None else None
            self.in_flight.labels(u.url).set(u.in_flight)
            self.running.labels(u.url).set(-1 if polled is None else polled.num_running)
            self.waiting.labels(u.url).set(-1 if polled is None else polled.num_waiting)
            self.kv_usage.labels(u.url).set(-1 if polled is None else polled.kv_usage)
            self.reachable.labels(u.url).set(int(u.reachable))
            self.ejected.labels(u.url).set(int(not u.health.routable(now)))
            self.failures.labels(u.url).set(max(u.health.request_failures,
                                                u.health.check_failures))
        self.prefix_keys.set(prefix_keys)
        return generate_latest(self.registry)
