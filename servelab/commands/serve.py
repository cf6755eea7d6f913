"""`servelab serve`: the OpenAI-compatible HTTP server on the real executor, or (--simulate)
on the simulator's cost model, each step taking its predicted time on the wall clock."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import NamedTuple

from executor.loading import DEFAULT_KV_CACHE_GIB
from servelab.model_args import add_model_args, load_model_from_args
from servelab.serve.simulated import round_trip_token_ids
from servelab.serve.tokenizer import Tokenizer
from servelab.sim_args import (
    add_parallel_args,
    add_scheduler_args,
    deployment_options,
    deployment_scheduler_config,
    scheduler_config,
)
from sim.deployment import DeploymentOptions, build_deployment
from sim.engine.core import Backend
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import DEFAULT_POLICY
from sim.engine.speculation.config import SpeculativeConfig

DEFAULT_SIMULATED_MODEL = DeploymentOptions.model  # `servelab simulate`'s default deployment


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `serve` subcommand."""
    parser = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="POST /v1/completions (streaming or not), GET /v1/models, /health and "
        "/metrics, on the executor driven by the scheduler (or, with --simulate, on a "
        "simulated deployment of any size). SIGTERM drains: new requests get 503, in-flight "
        "ones finish (or are aborted after --drain-timeout-s), then it exits.",
    )
    add_model_args(parser, default_model="tiny")
    _add_simulate_args(parser)
    parser.add_argument("--tokenizer", type=Path, default=None, metavar="DIR",
                        help="Hugging Face tokenizer directory (default: byte-level)")
    parser.add_argument("--seed", type=int, default=0,
                        help="random weights, and the seeds of requests that give none")
    parser.add_argument("--policy", default=None,
                        help="static|continuous|recompute|chunked (default continuous; under "
                             "--simulate, chunked with vLLM's limits when --model or --hardware "
                             "names the deployment, or the policy of the server a calibration "
                             "came from)")
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


def _add_simulate_args(parser: argparse.ArgumentParser) -> None:
    """--simulate and the deployment flags only it reads (as `servelab simulate` spells them)."""
    group = parser.add_argument_group("simulated deployment (--simulate)")
    group.add_argument("--simulate", action="store_true",
                       help="no weights: price each step with the simulator's cost model and "
                            "take that long in wall-clock time. --model is then a simulator "
                            f"model (default {DEFAULT_SIMULATED_MODEL}: a preset, a shipped "
                            "Hugging Face id or a config.json), --dtype bf16 or fp16 (and "
                            "vLLM's spellings; auto: bf16); the KV pool and max length are the "
                            "deployment's unless --num-blocks / --max-model-len. Tokens are "
                            "drawn by each request's seed from tokenizer ids whose text "
                            "re-encodes to themselves")
    group.add_argument("--hardware", default=None,
                       help="a GPU preset (`servelab hardware`; default h100) or a GPU file")
    add_parallel_args(group, serve=True)


class _Parts(NamedTuple):
    """What the server is assembled around, and the words that describe it."""

    scheduler: Scheduler
    backend: Backend
    vocab_size: int  # prompt and stop token ids must be below it
    name: str  # the served model id
    where: str  # the model and what runs its steps, for the listening line
    http_cpus: set[int] | None  # cores to free the event loop onto (serve_forever)


def run(args: argparse.Namespace) -> int:
    """Build the model (or the simulated one), assemble the server, serve until SIGTERM/SIGINT."""
    from servelab.serve.engine_thread import EngineThreadConfig
    from servelab.serve.server import ServerConfig, assemble, serve_forever
    from servelab.serve.state import ApiConfig, check_api_key
    from servelab.serve.tokenizer import load_tokenizer

    if args.api_key is not None:
        check_api_key(args.api_key)  # before minutes of loading a model, not after
    server = ServerConfig(args.host, args.port, args.drain_timeout_s, args.log_level)
    tokenizer = load_tokenizer(args.tokenizer)
    parts = (_simulated_parts(args, tokenizer) if args.simulate
             else _executor_parts(args, tokenizer))
    config = parts.scheduler.config
    api = ApiConfig(parts.name, config.max_model_len, args.api_key, args.max_body_bytes,
                    seed=args.seed)
    state = assemble(parts.scheduler, parts.backend, tokenizer, parts.vocab_size, api,
                     EngineThreadConfig(args.max_waiting), args.request_log)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)

    def listening(url: str) -> None:
        print(f"servelab serve: {parts.where}; {engine_figures(parts.scheduler)}; "
              f"listening on {url}", file=sys.stderr, flush=True)

    serve_forever(state, server, listening, parts.http_cpus)
    return 0


def engine_figures(scheduler: Scheduler) -> str:
    """The limits the engine runs with, read from its scheduler (not from the flags)."""
    config, spec = scheduler.config, scheduler.config.speculative
    speculation = ("" if spec is None else
                   f", speculative {spec.method} k={spec.num_speculative_tokens}")
    return (f"{config.policy}, {config.num_blocks} KV blocks of {config.block_size}, "
            f"token budget {config.budget}, {config.max_num_seqs} seqs, "
            f"max_model_len {config.max_model_len}{speculation}")


def _executor_parts(args: argparse.Namespace, tokenizer: Tokenizer) -> _Parts:
    """The model on the executor: torch threads pinned, the build run on its own thread."""
    from executor.loading import configure_cpu_threads
    from servelab.serve.server import call_on_thread

    simulator_only = [f for f, v in (
        ("--hardware", args.hardware), ("--tp", args.tp), ("--cost-model", args.cost_model),
        ("--data-parallel-size", args.data_parallel_size != 1 or None),
        ("--enable-expert-parallel", args.enable_expert_parallel or None),
        ("--quantization", args.quantization),
        ("--kv-cache-dtype", None if args.kv_cache_dtype == "auto" else args.kv_cache_dtype))
        if v is not None]
    if simulator_only:
        raise ValueError(f"{', '.join(simulator_only)}: only with --simulate (they "
                         "describe a simulated deployment)")
    _check_executor_speculation(args)
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    # torch loads now and pins this thread to one core. The build thread inherits that pin,
    # so it gets the thread count resolved here (counted there it would be 1).
    threads = configure_cpu_threads(args.threads)
    policy = args.policy or DEFAULT_POLICY
    model = args.model or args.default_model
    # Random weights (a preset) draw only ids whose text re-encodes to themselves, as the
    # simulated backend does; a checkpoint's tokens are its own.
    allowed = None if Path(model).is_dir() else round_trip_token_ids(tokenizer)
    loaded, scheduler, backend = call_on_thread(lambda: _build(args, threads, policy, allowed))
    name = Path(model).name if Path(model).is_dir() else model
    return _Parts(scheduler, backend, loaded.vocab_size, name,
                  f"{name} on {loaded.device} ({loaded.threads} threads)", cpus)


def _check_executor_speculation(args: argparse.Namespace) -> None:
    """Before the model loads: the executor proposes by n-gram lookup only."""
    if not args.speculative_config:
        return
    spec = SpeculativeConfig.from_json(args.speculative_config)
    if spec.method != "ngram":
        raise ValueError(f"--speculative-config: method {spec.method!r} has no drafter on the "
                         "executor yet; use ngram (or --simulate)")


def _simulated_parts(args: argparse.Namespace, tokenizer: Tokenizer) -> _Parts:
    """The scheduler on a cost model paced in wall-clock time; no torch, no weights."""
    from servelab.serve.simulated import SimulatedBackend, simulate_speculation

    executor_only = [flag for flag, given in (
        ("--device", args.device != "auto"), ("--threads", args.threads is not None),
        ("--kv-cache-gib", args.kv_cache_gib != DEFAULT_KV_CACHE_GIB)) if given]
    if executor_only:
        raise ValueError(f"{', '.join(executor_only)}: not with --simulate (they configure "
                         "the executor; size the KV pool with --num-blocks)")
    if args.data_parallel_size != 1:
        raise ValueError("--data-parallel-size: serve runs one engine; put `servelab route` "
                         "in front of several servers for data parallelism")
    deployment = build_deployment(deployment_options(
        args, args.num_blocks, model=DEFAULT_SIMULATED_MODEL, hardware="h100",
        tensor_parallel=1))
    config = deployment_scheduler_config(args, args.policy, deployment)
    cost = deployment.cost_model
    scheduler = Scheduler(config)
    backend = SimulatedBackend(cost, round_trip_token_ids(tokenizer),
                               acceptance=simulate_speculation(scheduler))
    # The served id: --model, else what a calibration was measured on, else the preset.
    name = args.model or getattr(cost, "meta", {}).get("model") or DEFAULT_SIMULATED_MODEL
    return _Parts(scheduler, backend, tokenizer.vocab_size, name,
                  f"{name}, simulated {deployment.description_at(config.budget)}",
                  None)


def _build(args: argparse.Namespace, threads: int, policy: str,
           allowed_token_ids: tuple[int, ...] | None) -> tuple:
    """The model, the scheduler and the backend (run off the main thread: call_on_thread);
    `threads` as resolved on the main thread."""
    from executor.backend import ModelBackend

    loaded = load_model_from_args(args, threads)
    num_blocks = loaded.kv_blocks(args.block_size, args.kv_cache_gib)
    config = scheduler_config(args, policy, num_blocks,
                              loaded.max_model_len(args.max_model_len),
                              lambda gib: loaded.kv_blocks(args.block_size, gib))
    scheduler = Scheduler(config)
    backend = ModelBackend(loaded.model, scheduler.block_manager,
                           allowed_token_ids=allowed_token_ids)
    return loaded, scheduler, backend
