"""A model loaded for an engine, with the facts a run reports: device, dtype, threads, KV; and
the CPU threads and allocator set up before torch loads (so this module never imports torch
at its top)."""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

from sim.specs.engine_limits import ENGINE_DEFAULTS, kv_blocks
from sim.specs.hardware import GiB

DEFAULT_KV_CACHE_GIB = 1.0


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
        return max(1, kv_blocks(kv_cache_gib * GiB, per_token * block_size))

    def max_model_len(self, requested: int | None) -> int:
        limit = self.model.args.max_position_embeddings
        if requested is None:
            return min(limit, ENGINE_DEFAULTS.max_model_len)
        if requested > limit:
            raise ValueError(f"--max-model-len {requested} exceeds the model's {limit} positions")
        return requested



def load(name: str, device: str = "auto", dtype: str = "auto", threads: int | None = None,
         seed: int = 0) -> LoadedModel:
    """Pin CPU threads (before torch loads), then load the model `name` (a preset or a
    Hugging Face checkpoint directory) on its device."""
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


# CPU threads and allocator for the executor; call configure_cpu_threads() before torch loads.
#
# Default: one thread per core, pinned (OMP_PROC_BIND=close, OMP_PLACES=cores). Unpinned,
# torch's spinning OpenMP threads made peer-model steps 4-6x slower on a 2-vCPU VM (a whole
# peer run: 59 tok/s unpinned vs 300-430 pinned). Best-of-30 step times on that VM (ms):
#                                 decode batch 1   decode batch 8   prefill 8 seqs
#   pinned, 2 threads (default)        8.5-9.4         12.6-14          118-143
#   OMP_WAIT_POLICY=PASSIVE, 2        12.1-12.7        16.7-17.7        144-168
#   1 thread                          11.0-12.3        17-20            229-245
# When other processes keep a core busy, two pinned threads wait on each other (whole runs
# dropped to 110-150 tok/s); pass num_threads=1 (`--threads 1`) on such a shared machine.
# OpenMP reads these variables when torch loads it, so they only take effect if set before
# `import torch`; values the user already set win. The thread count works at any time.
#
# The allocator: glibc serves blocks over its mmap threshold (at most 32 MiB) with fresh
# mmaps, so every large step buffer (gathered KV, attention scores) page-faults in anew on
# each use. Raising the threshold keeps them in the heap for reuse: measured on the peer model,
# 64 decodes at 1,792 tokens of KV went from 540-620 ms to 218-224 ms a step, 16 at 1,024
# from 85-91 to 41-51 ms, a 1,024-token prefill from 395-435 to 328-340 ms. Skipped when the
# user set MALLOC_MMAP_THRESHOLD_ or the C library is not glibc.

# OpenMP settings applied when torch is not imported yet (user-set values win).
OMP_DEFAULTS = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}
# glibc mallopt parameters (malloc.h) and the values set: blocks up to 1 GiB come from the
# heap, and up to 2 GiB of free heap stays mapped instead of being trimmed after each step.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES = 1 << 30, 1 << 31


def configure_cpu_threads(num_threads: int | None = None) -> int:
    """Pin OpenMP threads (if torch is not loaded yet) and set torch's intra-op thread count.

    num_threads None uses one thread per available core. Returns the thread count in use.
    """
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    # Count cores first: once OpenMP binds the main thread, its affinity is a single core.
    count = num_threads or _available_cores()
    if "torch" not in sys.modules:
        for key, value in OMP_DEFAULTS.items():
            os.environ.setdefault(key, value)
    keep_large_allocations()
    import torch

    torch.set_num_threads(count)
    return torch.get_num_threads()


def keep_large_allocations() -> bool:
    """Let glibc reuse large freed blocks instead of unmapping them; False if not applied."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                    and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False


def _available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
