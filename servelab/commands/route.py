"""`servelab route`: an HTTP router in front of OpenAI-compatible servers."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from sim.cluster.router import ROUTERS

if TYPE_CHECKING:
    from servelab.route.retry import RetryConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `route` subcommand."""
    parser = subparsers.add_parser(
        "route", help="route requests across several OpenAI-compatible servers",
        description="POST /v1/completions and /v1/chat/completions go to one upstream, chosen "
        "by the simulator's router from each upstream's /metrics (polled) and the router's own "
        "in-flight counts; bodies pass unchanged, streams chunk by chunk. GET /v1/models comes "
        "from the first upstream that answers; /health and /metrics are the router's own. An "
        "upstream that fails requests or health checks is ejected for a growing back-off; a "
        "request whose client has received nothing yet goes to another upstream when its try "
        "fails, outlives its deadline or its upstream is ejected. "
        "docs/route.md describes the health and retry rules and the prefix-aware router's "
        "index.",
    )
    parser.add_argument("--upstream", required=True, metavar="URL1,URL2,...",
                        help="comma-separated base URLs, e.g. http://127.0.0.1:8001")
    parser.add_argument("--router", default="round-robin", choices=ROUTERS,
                        help="how to pick an upstream (default round-robin)")
    parser.add_argument("--metrics-interval-s", type=float, default=0.5,
                        help="seconds between reads of each upstream's /metrics (default 0.5)")
    parser.add_argument("--prefix-block-tokens", type=int, default=16,
                        help="prefix-aware: tokens per indexed block (text: 4 bytes a token)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free one)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' (forwarded to the upstreams)")
    parser.add_argument("--drain-timeout-s", type=float, default=30.0,
                        help="after SIGTERM, open responses get this long (default 30)")
    parser.add_argument("--log-level", default="warning", help="log level (default warning)")
    _add_health_args(parser)
    _add_retry_args(parser)
    parser.set_defaults(func=run)


def _add_health_args(parser: argparse.ArgumentParser) -> None:
    """Timeouts, active health checks and outlier ejection (docs/route.md, "Failures")."""
    group = parser.add_argument_group("upstream timeouts and health")
    group.add_argument("--connect-timeout-s", type=float, default=5.0,
                       help="a connection not made by then counts as refused: the request "
                       "goes to another upstream (default 5)")
    group.add_argument("--first-byte-timeout-s", type=float, default=60.0,
                       help="from sending a streamed request to its first event, connecting "
                       "included, on top of the per-try deadline (default 60)")
    group.add_argument("--read-timeout-s", type=float, default=600.0,
                       help="longest silence of an upstream mid-response (default 600)")
    group.add_argument("--health-check-interval-s", type=float, default=1.0,
                       help="GET each upstream's health path this often; 0: no checks "
                       "(default 1)")
    group.add_argument("--health-check-timeout-s", type=float, default=2.0,
                       help="a check not answered 200 by then failed (default 2)")
    group.add_argument("--health-check-path", default="/health",
                       help="the path checked (default /health)")
    group.add_argument("--eject-after-failures", type=int, default=3,
                       help="consecutive failed requests, or failed checks, that take an "
                       "upstream out of rotation (default 3)")
    group.add_argument("--ejection-base-s", type=float, default=2.0,
                       help="the first ejection's back-off; each next one doubles (default 2)")
    group.add_argument("--ejection-max-s", type=float, default=30.0,
                       help="the back-off's cap (default 30)")


def _add_retry_args(parser: argparse.ArgumentParser) -> None:
    """Per-try deadlines, the request budget and retries (docs/route.md, "Retries")."""
    group = parser.add_argument_group("deadlines and retries")
    group.add_argument("--per-try-timeout-s", type=float, default=None,
                       help="one try's deadline for a whole answer (a stream: its first event); "
                       "default: --tpot-headroom x max_tokens x the upstream's TPOT, at least "
                       "--per-try-floor-s")
    group.add_argument("--per-try-floor-s", type=float, default=10.0,
                       help="the least derived per-try deadline (default 10)")
    group.add_argument("--tpot-headroom", type=float, default=4.0,
                       help="the derived per-try deadline's factor over max_tokens x TPOT "
                       "(default 4)")
    group.add_argument("--request-timeout-s", type=float, default=600.0,
                       help="the client's total budget, every try and the stream included "
                       "(default 600)")
    group.add_argument("--retries", type=int, default=2,
                       help="tries after a failed one the client saw nothing of (default 2)")
    group.add_argument("--retry-budget-ratio", type=float, default=0.2,
                       help="retries allowed per request received in the last 10 s "
                       "(default 0.2)")
    group.add_argument("--retry-budget-min", type=int, default=10,
                       help="retries allowed in the last 10 s however few requests came "
                       "(default 10)")


def run(args: argparse.Namespace) -> int:
    """Compose the router's configuration and route until SIGTERM/SIGINT."""
    from servelab.route.app import serve_routes
    from servelab.route.health import HealthConfig
    from servelab.route.state import RouteConfig
    from servelab.serve.server import ServerConfig
    from sim.cluster.router import RouterConfig

    upstreams = tuple(url.strip().rstrip("/") for url in args.upstream.split(",") if url.strip())
    health = HealthConfig(args.health_check_interval_s, args.health_check_timeout_s,
                          args.health_check_path, args.eject_after_failures,
                          args.ejection_base_s, args.ejection_max_s)
    config = RouteConfig(upstreams, RouterConfig(args.router), args.metrics_interval_s,
                         args.api_key, args.prefix_block_tokens,
                         connect_timeout_s=args.connect_timeout_s,
                         read_timeout_s=args.read_timeout_s,
                         first_byte_timeout_s=args.first_byte_timeout_s, health=health,
                         retry=_retry_config(args))
    server = ServerConfig(args.host, args.port, args.drain_timeout_s, args.log_level)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)

    def listening(url: str) -> None:
        print(f"servelab route: {args.router} over {len(upstreams)} upstreams "
              f"({', '.join(upstreams)}); listening on {url}", file=sys.stderr, flush=True)

    serve_routes(config, server, listening)
    return 0


def _retry_config(args: argparse.Namespace) -> RetryConfig:
    """The deadlines and retries the flags ask for."""
    from servelab.route.retry import RetryConfig

    return RetryConfig(args.retries, args.per_try_timeout_s, args.per_try_floor_s,
                       args.tpot_headroom, request_timeout_s=args.request_timeout_s,
                       budget_ratio=args.retry_budget_ratio, budget_min=args.retry_budget_min)
