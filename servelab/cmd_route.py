"""`servelab route`: an HTTP router in front of OpenAI-compatible servers."""

from __future__ import annotations

import argparse
import logging
import sys

from sim.router import ROUTERS


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `route` subcommand."""
    parser = subparsers.add_parser(
        "route", help="route requests across several OpenAI-compatible servers",
        description="POST /v1/completions and /v1/chat/completions go to one upstream, chosen "
        "by the simulator's router from each upstream's /metrics (polled) and the router's own "
        "in-flight counts; bodies pass unchanged, streams chunk by chunk. GET /v1/models comes "
        "from the first upstream that answers; /health and /metrics are the router's own. "
        "docs/route.md describes the prefix-aware router's index.",
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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Compose the router's configuration and route until SIGTERM/SIGINT."""
    from serve.route import RouteConfig, serve_routes
    from serve.server import ServerConfig
    from sim.router import RouterConfig

    upstreams = tuple(url.strip().rstrip("/") for url in args.upstream.split(",") if url.strip())
    config = RouteConfig(upstreams, RouterConfig(args.router), args.metrics_interval_s,
                         args.api_key, args.prefix_block_tokens)
    server = ServerConfig(args.host, args.port, args.drain_timeout_s, args.log_level)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)

    def listening(url: str) -> None:
        print(f"servelab route: {args.router} over {len(upstreams)} upstreams "
              f"({', '.join(upstreams)}); listening on {url}", file=sys.stderr, flush=True)

    serve_routes(config, server, listening)
    return 0
