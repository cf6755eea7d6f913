"""The engines' per-step host overhead: the one term no operator profile can show.

- splitwise: Splitwise's measuring engine runs eagerly (no CUDA graphs), so a layer takes
  at least the host's dispatch of its kernels; and its 2023 software stack reaches a lower
  FLOP/s than the profiled kernels. Both set on Splitwise's BLOOM-176B steps (same engine
  and hosts, a model the Llama-2-70B validation never uses), per GPU host: the dispatch time
  per kernel that zeroes BLOOM's median decode error, the compute scale that zeroes its
  median prefill error.
vLLM's own terms are set apart, on whole vLLM runs (servelab.calibration.engine_fit).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from servelab.calibration.splitwise import splitwise_steps
from sim.cost.engine_overhead import EngineOverhead
from sim.cost.gpu_cost import GpuCostModel
from sim.cost.gpu_shapes import known_gpu, known_shapes


def _bisect(median_error, lo: float, hi: float) -> float:
    """The x in [lo, hi] where median_error (rising in x) crosses zero, or an end."""
    if median_error(lo) >= 0.0:
        return lo
    if median_error(hi) <= 0.0:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if median_error(mid) < 0.0 else (lo, mid)
    return (lo + hi) / 2


def _median_error(gpu: str, phase: str, kernel_s: float, compute_scale: float) -> float:
    """Median signed error of BLOOM-176B `phase` steps on `gpu` with these engine terms."""
    shapes = known_shapes("bloom-176b")
    engine = EngineOverhead("probe", 0.0, kernel_s, 0.0, "", compute_scale=compute_scale)
    errors = []
    for step in splitwise_steps(model="bloom-176b"):
        if step.gpu == gpu and step.phase == phase:
            model = GpuCostModel(shapes, known_gpu(gpu), engine, tensor_parallel=step.tp)
            errors.append((model.predict(step.plan()) - step.measured_s) / step.measured_s)
    return float(np.median(errors))


def _decode_error(gpu: str, compute_scale: float, kernel_s: float) -> float:
    return _median_error(gpu, "decode", kernel_s, compute_scale)


def _prefill_error(gpu: str, kernel_s: float, compute_scale: float) -> float:
    return -_median_error(gpu, "prefill", kernel_s, compute_scale)


def splitwise_terms(gpu: str) -> tuple[float, float]:
    """(host dispatch per kernel, compute scale) of Splitwise's engine on `gpu`: each leaves
    the median BLOOM-176B error of its phase at zero (decode: dispatch; prefill: compute),
    alternated until both settle."""
    kernel_s, scale = 0.0, 1.0
    for _ in range(4):
        kernel_s = _bisect(partial(_decode_error, gpu, scale), 0.0, 1e-3)
        # A lower scale slows prefill, so the error falls as the scale rises.
        scale = _bisect(partial(_prefill_error, gpu, kernel_s), 0.05, 1.0)
    return kernel_s, scale


def engine_entries(data: dict) -> dict:
    """The 'engines' section of the fit file (needs the GPU terms already written)."""
    splitwise = {gpu: splitwise_terms(gpu) for gpu in ("a100-80gb", "h100")}
    return {
        **{f"splitwise-{gpu}": {
            "_what": "Splitwise's eager engine: host dispatch time per kernel; its GEMM and "
                     "attention FLOP/s as a fraction of the profiled kernels'",
            "step_s": 0.0, "per_kernel_s": per_kernel, "per_row_s": 0.0,
            "compute_scale": scale,
            "source": f"Splitwise BLOOM-176B steps on {gpu} (zero median error per phase)"}
           for gpu, (per_kernel, scale) in splitwise.items()},
    }
