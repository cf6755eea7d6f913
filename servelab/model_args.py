"""Arguments for subcommands that run the real model: --model, --device, --dtype, threads, KV."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

DEFAULT_KV_CACHE_GIB = 1.0
DEFAULT_MAX_MODEL_LEN = 8192


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


@dataclass
class LoadedModel:
    """A model ready to back an engine, and the facts the CLI reports."""

    model: Any  # executor.model.Transformer
    device: Any  # torch.device
    dtype: Any  # torch.dtype
    threads: int
    name: str

    @property
    def vocab_size(self) -> int:
        return self.model.args.vocab_size

    @property
    def kernels(self) -> str:
        """`native` (servelab's CPU kernels) or `torch` (executor/native.py)."""
        return "native" if self.model.native else "torch"

    def kv_blocks(self, block_size: int, kv_cache_gib: float) -> int:
        """Blocks of block_size tokens that kv_cache_gib of KV holds for this model."""
        if not kv_cache_gib > 0:
            raise ValueError(f"--kv-cache-gib must be > 0, got {kv_cache_gib}")
        args = self.model.args
        itemsize = self.model.tok_embeddings.element_size()
        per_token = 2 * args.n_layers * args.n_kv_heads * args.head_dim * itemsize
        return max(1, int(kv_cache_gib * 2**30) // (per_token * block_size))

    def max_model_len(self, requested: int | None) -> int:
        limit = self.model.args.max_position_embeddings
        if requested is None:
            return min(limit, DEFAULT_MAX_MODEL_LEN)
        if requested > limit:
            raise ValueError(f"--max-model-len {requested} exceeds the model's {limit} positions")
        return requested


def load_model_from_args(args: argparse.Namespace) -> LoadedModel:
    """Pin CPU threads (before torch loads), then load the model on its device."""
    from executor.threads import configure_cpu_threads

    threads = configure_cpu_threads(args.threads)
    from executor.backend import load_model, resolve_device, resolve_dtype

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    model = load_model(args.model, device, dtype, seed=args.seed)
    return LoadedModel(model, device, dtype, threads, args.model)
