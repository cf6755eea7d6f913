"""A model loaded for an engine, with the facts a run reports: device, dtype, threads, KV."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

DEFAULT_KV_CACHE_GIB = 1.0
DEFAULT_MAX_MODEL_LEN = 8192


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



def load(name: str, device: str = "auto", dtype: str = "auto", threads: int | None = None,
         seed: int = 0) -> LoadedModel:
    """Pin CPU threads (before torch loads), then load the model `name` (a preset or a
    Hugging Face checkpoint directory) on its device."""
    from executor.threads import configure_cpu_threads

    pinned = configure_cpu_threads(threads)
    from executor.backend import load_model, resolve_device, resolve_dtype

    resolved = resolve_device(device)
    resolved_dtype = resolve_dtype(dtype, resolved)
    model = load_model(name, resolved, resolved_dtype, seed=seed)
    return LoadedModel(model, resolved, resolved_dtype, pinned, name)


def cpu_model() -> str:
    """The processor's model name (/proc/cpuinfo on Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
