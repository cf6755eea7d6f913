"""CPU threading for the executor; call configure_cpu_threads() before torch is imported.

Default: one thread per core, pinned (OMP_PROC_BIND=close, OMP_PLACES=cores). Unpinned,
torch's spinning OpenMP threads made peer-model steps 4-6x slower on a 2-vCPU VM (a whole
peer run: 59 tok/s unpinned vs 300-430 pinned). Best-of-30 step times on that VM (ms):
                                decode batch 1   decode batch 8   prefill 8 seqs
  pinned, 2 threads (default)        8.5-9.4         12.6-14          118-143
  OMP_WAIT_POLICY=PASSIVE, 2        12.1-12.7        16.7-17.7        144-168
  1 thread                          11.0-12.3        17-20            229-245
When other processes keep a core busy, two pinned threads wait on each other (whole runs
dropped to 110-150 tok/s); pass num_threads=1 (`--threads 1`) on such a shared machine.
OpenMP reads these variables when torch loads it, so they only take effect if set before
`import torch`; values the user already set win. The thread count works at any time.
"""

from __future__ import annotations

import os
import sys

# OpenMP settings applied when torch is not imported yet (user-set values win).
OMP_DEFAULTS = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}


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
    import torch

    torch.set_num_threads(count)
    return torch.get_num_threads()


def _available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
