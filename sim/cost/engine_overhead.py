"""An engine's host time per step, the one term of a GPU step no operator profile can show.

The fitted GPU cost model (sim.cost.gpu_cost) adds it to the GPU's time: vLLM's scheduling, input
preparation and output processing, overlapped with the GPU under async scheduling, or an
eager engine's kernel dispatch (a layer takes at least its kernels' dispatch time). The
numbers live in the fit file's "engines" section (servelab.calibration.gpu_engine sets them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sim.cost.gpu_terms import FIT_PATH


@dataclass(frozen=True)
class EngineOverhead:
    """Host time of one engine step that the GPU kernels do not hide."""

    name: str
    step_s: float  # scheduling, input preparation, output processing: once a step
    # Eager engines (no CUDA graphs): the host's time to dispatch one kernel; a layer takes
    # at least its kernels' dispatch time (0 under CUDA graphs).
    per_kernel_s: float
    per_row_s: float  # input preparation and detokenisation per scheduled sequence
    source: str  # which data set set these numbers
    # Async scheduling (vLLM V1): the host prepares step n+1 while the GPU runs step n, so
    # a step takes the longer of the two instead of their sum.
    overlapped: bool = False
    # The engine's kernels' FLOP/s as a fraction of the profiled kernels' (an older software
    # stack: other GEMM and attention libraries); 1 for the stack the profiles measured.
    compute_scale: float = 1.0

    def __post_init__(self) -> None:
        for key in ("step_s", "per_kernel_s", "per_row_s"):
            if not getattr(self, key) >= 0.0:
                raise ValueError(f"engine {self.name}: {key} must be >= 0")
        if not 0.0 < self.compute_scale <= 1.0:
            raise ValueError(f"engine {self.name}: compute_scale must be in (0, 1]")


def load_engine(name: str, path: Path = FIT_PATH) -> EngineOverhead:
    """An engine's overhead terms from the fit file, by name (vllm, splitwise)."""
    engines = json.loads(path.read_text())["engines"]
    if name not in engines:
        raise ValueError(f"unknown engine {name!r}; known: {', '.join(engines)}")
    e = engines[name]
    return EngineOverhead(name, e["step_s"], e["per_kernel_s"], e["per_row_s"], e["source"],
                          e.get("overlapped", False), e.get("compute_scale", 1.0))
