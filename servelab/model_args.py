"""Arguments for subcommands that run the real model: --model, --device, --dtype, threads, KV."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from executor.loading import DEFAULT_KV_CACHE_GIB, LoadedModel

if TYPE_CHECKING:  # the HTTP client loads only when a command talks to a server
    from servelab.bench.connection import BenchConfig


def add_model_args(parser: argparse.ArgumentParser, default_model: str = "peer-45m") -> None:
    """--model, --device, --dtype, --threads, --kv-cache-gib."""
    group = parser.add_argument_group("model (executor)")
    group.add_argument("--model", default=None,
                       help="preset (tiny, peer-45m, qwen2.5-0.5b, llama-3-8b; random weights "
                            f"from --seed) or a Hugging Face checkpoint directory (default "
                            f"{default_model}); with --url, the served model's id (default: "
                            "the server's first)")
    parser.set_defaults(default_model=default_model)
    group.add_argument("--device", default="auto", help="cpu, cuda[:N] or auto")
    group.add_argument("--dtype", default="auto",
                       help="float32, bfloat16 or float16 (auto: float32 on CPU, bf16 on CUDA)")
    group.add_argument("--threads", type=int, default=None,
                       help="CPU threads (default: one per available core, pinned)")
    group.add_argument("--kv-cache-gib", type=float, default=DEFAULT_KV_CACHE_GIB,
                       help="KV pool size when --num-blocks is not given")


def load_model_from_args(args: argparse.Namespace, threads: int | None = None) -> LoadedModel:
    """The model --model, --device, --dtype, --threads and --seed name (`threads`, when
    given, in place of --threads)."""
    from executor.loading import load

    return load(args.model or args.default_model, args.device, args.dtype,
                args.threads if threads is None else threads, args.seed)


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """--url, --api-key, --vocab-size, and the limits a server may not publish."""
    group = parser.add_argument_group("a running server instead of the executor")
    group.add_argument("--url", default=None,
                       help="an OpenAI-compatible streaming server's base URL, e.g. "
                            "http://127.0.0.1:8000")
    group.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    group.add_argument("--vocab-size", type=int, default=None,
                       help="prompt token ids are drawn below this (default: the server's)")
    group.add_argument("--server-policy", default="chunked",
                       help="the server's batching policy (vLLM v1: chunked)")


def server_from_args(args: argparse.Namespace) -> BenchConfig:
    """The server --url, --model and --api-key name."""
    from servelab.bench.connection import BenchConfig

    return BenchConfig(args.url, args.model, args.api_key)
