"""`servelab serve`: the OpenAI-compatible HTTP server on the real executor."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from servelab.model_args import add_model_args, load_model_from_args
from servelab.sim_args import add_scheduler_args, scheduler_config


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `serve` subcommand."""
    parser = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="POST /v1/completions (streaming or not), GET /v1/models, /health and "
        "/metrics, on the executor driven by the scheduler. SIGTERM drains: new requests get "
        "503, in-flight ones finish (or are aborted after --drain-timeout-s), then it exits.",
    )
    add_model_args(parser, default_model="tiny")
    parser.add_argument("--tokenizer", type=Path, default=None, metavar="DIR",
                        help="Hugging Face tokenizer directory (default: byte-level)")
    parser.add_argument("--seed", type=int, default=0,
                        help="random weights, and the seeds of requests that give none")
    parser.add_argument("--policy", default="continuous",
                        help="static|continuous|recompute|chunked")
    add_scheduler_args(parser)
    http = parser.add_argument_group("http")
    http.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    http.add_argument("--port", type=int, default=8000, help="port (0: any free one)")
    http.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    http.add_argument("--request-log", type=Path, default=None, metavar="F.sqlite",
                      help="append every request to this SQLite log")
    http.add_argument("--max-waiting", type=int, default=1024,
                      help="queued requests before 503 (default 1024)")
    http.add_argument("--max-body-bytes", type=int, default=1 << 20,
                      help="largest request body (default 1 MiB)")
    http.add_argument("--drain-timeout-s", type=float, default=30.0,
                      help="after SIGTERM, in-flight requests get this long (default 30)")
    http.add_argument("--log-level", default="warning", help="uvicorn's log level")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the model, assemble the server and serve until SIGTERM/SIGINT."""
    from executor.threads import configure_cpu_threads
    from serve.engine_thread import EngineThreadConfig
    from serve.server import ServerConfig, assemble, call_on_thread, serve_forever
    from serve.state import ApiConfig
    from serve.tokenizer import load_tokenizer

    server = ServerConfig(args.host, args.port, args.drain_timeout_s, args.log_level)
    tokenizer = load_tokenizer(args.tokenizer)
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    # torch loads now and pins this thread to one core. The build thread inherits that pin,
    # so it gets the thread count resolved here (counted there it would be 1).
    threads = configure_cpu_threads(args.threads)
    build_args = argparse.Namespace(**{**vars(args), "threads": threads})
    loaded, scheduler, backend = call_on_thread(lambda: _build(build_args))
    config = scheduler.config
    model = args.model or args.default_model
    name = Path(model).name if Path(model).is_dir() else model
    api = ApiConfig(name, config.max_model_len, args.api_key, args.max_body_bytes,
                    seed=args.seed)
    state = assemble(scheduler, backend, tokenizer, loaded.vocab_size, api,
                     EngineThreadConfig(args.max_waiting), args.request_log)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)

    def listening(url: str) -> None:
        print(f"servelab serve: {name} on {loaded.device} ({loaded.threads} threads), "
              f"{config.policy}, {config.num_blocks} KV blocks of {config.block_size}; "
              f"listening on {url}", file=sys.stderr, flush=True)

    serve_forever(state, server, listening, cpus)
    return 0


def _build(args: argparse.Namespace) -> tuple:
    """The model, the scheduler and the backend (run off the main thread: call_on_thread)."""
    from executor.backend import ModelBackend
    from sim.scheduler import Scheduler

    loaded = load_model_from_args(args)
    num_blocks = loaded.kv_blocks(args.block_size, args.kv_cache_gib)
    config = scheduler_config(args, args.policy, num_blocks,
                              loaded.max_model_len(args.max_model_len))
    scheduler = Scheduler(config)
    return loaded, scheduler, ModelBackend(loaded.model, scheduler.block_manager)
