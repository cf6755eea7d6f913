"""Arguments for subcommands that run the real model: --model, --device, --dtype, threads, KV."""

from __future__ import annotations

import argparse

from executor.loading import DEFAULT_KV_CACHE_GIB, LoadedModel


def add_model_args(parser: argparse.ArgumentParser, default_model: str = "peer-45m") -> None:
    """--model, --device, --dtype, --threads, --kv-cache-gib."""
    group = parser.add_argument_group("model (executor)")
    group.add_argument("--model", default=default_model,
                       help="preset (tiny, peer-45m, qwen2.5-0.5b, llama-3-8b; random weights "
                            "from --seed) or a Hugging Face checkpoint directory")
    group.add_argument("--device", default="auto", help="cpu, cuda[:N] or auto")
    group.add_argument("--dtype", default="auto",
                       help="float32, bfloat16 or float16 (auto: float32 on CPU, bf16 on CUDA)")
    group.add_argument("--threads", type=int, default=None,
                       help="CPU threads (default: one per available core, pinned)")
    group.add_argument("--kv-cache-gib", type=float, default=DEFAULT_KV_CACHE_GIB,
                       help="KV pool size when --num-blocks is not given")


def load_model_from_args(args: argparse.Namespace) -> LoadedModel:
    """The model --model, --device, --dtype, --threads and --seed name."""
    from executor.loading import load

    return load(args.model, args.device, args.dtype, args.threads, args.seed)
