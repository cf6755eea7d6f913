"""An engine's own time: the host work around a GPU step and the front end around a request,
the terms no operator profile can show.

The fitted and measured-kernel GPU cost models (sim.cost.gpu_cost, sim.cost.kernel_cost) add
them to the GPU's time. vLLM's named terms live in sim/cost/data/vllm_engine.json
(servelab.calibration.engine_fit sets them); the eager Splitwise engines' in the fit file's
"engines" section (servelab.calibration.gpu_engine sets them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sim.cost.gpu_terms import FIT_PATH

VLLM_PATH = Path(__file__).parent / "data" / "vllm_engine.json"
VLLM_TERMS = ("step_s", "per_row_s", "piecewise_layer_s", "request_s")  # what engine_fit sets


@dataclass(frozen=True)
class EngineOverhead:
    """An engine's time that the GPU kernels do not show, in named terms."""

    name: str
    step_s: float  # scheduling, input preparation, sampling bookkeeping: once a step
    # Eager engines (no CUDA graphs): the host's time to dispatch one kernel; a layer takes
    # at least its kernels' dispatch time (0 under CUDA graphs).
    per_kernel_s: float
    # Output processing per scheduled sequence a step: each output token's detokenization
    # and streaming by the front end (host time, overlapped like step_s).
    per_row_s: float
    source: str  # which data set set these numbers
    # Async scheduling (vLLM >= 0.11): the host prepares step n+1 while the GPU runs step n,
    # so a step takes the longer of the two instead of their sum.
    overlapped: bool = False
    # The engine's kernels' FLOP/s as a fraction of the profiled kernels' (an older software
    # stack: other GEMM and attention libraries); 1 for the stack the profiles measured.
    compute_scale: float = 1.0
    # Front end per request: API server, tokenization, the first token's detokenization and
    # streaming; the scheduler sees a request this much after it arrived (TTFT, once).
    request_s: float = 0.0
    # Largest decode-only batch replayed as one full CUDA graph (vLLM's
    # max_cudagraph_capture_size); 0: none. Other steps (prefill or mixed batches, larger
    # decodes) run piecewise graphs with attention launched between the pieces.
    graph_max_rows: int = 0
    # Host time per layer of a piecewise step (graph pieces and eager attention launches):
    # the layer takes the longer of it and the GPU's time.
    piecewise_layer_s: float = 0.0

    def __post_init__(self) -> None:
        for key in ("step_s", "per_kernel_s", "per_row_s", "request_s", "piecewise_layer_s"):
            if not getattr(self, key) >= 0.0:
                raise ValueError(f"engine {self.name}: {key} must be >= 0")
        if self.graph_max_rows < 0:
            raise ValueError(f"engine {self.name}: graph_max_rows must be >= 0")
        if not 0.0 < self.compute_scale <= 1.0:
            raise ValueError(f"engine {self.name}: compute_scale must be in (0, 1]")

    def full_graph(self, prefill_tokens: int, decode_seqs: int) -> bool:
        """Whether a step of these tokens replays one full CUDA graph (no piecewise host)."""
        return not prefill_tokens and decode_seqs <= self.graph_max_rows


def _version(text: str) -> tuple[int, ...]:
    """'0.12.0' -> (0, 12, 0); ValueError naming the text when it is no version."""
    try:
        return tuple(int(part) for part in text.split(".")[:3])
    except ValueError:
        raise ValueError(f"vLLM version {text!r}: expected digits like 0.12.0") from None


def async_scheduling(vllm_version: str | None, path: Path = VLLM_PATH) -> bool:
    """Whether vLLM `vllm_version` schedules asynchronously by default (None: today's)."""
    if vllm_version is None:
        return True
    since = json.loads(path.read_text())["async_since"]["value"]
    return _version(vllm_version) >= _version(since)


def load_vllm(vllm_version: str | None = None, path: Path = VLLM_PATH) -> EngineOverhead:
    """vLLM's terms; the host overlaps the GPU from the version that schedules
    asynchronously by default (any version when none is given: today's vLLM)."""
    data = json.loads(path.read_text())
    terms = {key: float(data[key]["value"]) for key in VLLM_TERMS}
    return EngineOverhead("vllm", terms["step_s"], 0.0, terms["per_row_s"], data["source"],
                          async_scheduling(vllm_version, path), request_s=terms["request_s"],
                          graph_max_rows=int(data["graph_max_rows"]["value"]),
                          piecewise_layer_s=terms["piecewise_layer_s"])


def load_engine(name: str, path: Path = FIT_PATH,
                vllm_version: str | None = None) -> EngineOverhead:
    """An engine's overhead terms by name (vllm, splitwise-<gpu>)."""
    if name == "vllm":
        return load_vllm(vllm_version)
    engines = json.loads(path.read_text())["engines"]
    if name not in engines:
        raise ValueError(f"unknown engine {name!r}; known: vllm, {', '.join(engines)}")
    e = engines[name]
    return EngineOverhead(name, e["step_s"], e["per_kernel_s"], e["per_row_s"], e["source"],
                          e.get("overlapped", False), e.get("compute_scale", 1.0))
