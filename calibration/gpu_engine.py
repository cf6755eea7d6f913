"""The engines' per-step host overhead: the one term no operator profile can show.

- splitwise: Splitwise's measuring engine runs eagerly (no CUDA graphs), so the host's
  kernel dispatch bounds every kernel from below. Set on Splitwise's BLOOM-176B steps
  (same engine and hosts, a model the Llama-2-70B validation never uses): the dispatch time
  per kernel that leaves BLOOM's median step error at zero, per GPU host.
- vllm: vLLM V1 replays decode under CUDA graphs, so no per-layer dispatch; its scheduler,
  input preparation and output processing cost a fixed time per step and per sequence, and
  with async scheduling (on by default) run while the GPU computes the previous step.
"""

from __future__ import annotations

import numpy as np

from calibration.splitwise import splitwise_steps
from sim.gpu_cost import EngineOverhead, GpuCostModel
from sim.gpu_shapes import known_gpu, known_shapes

# vLLM V1's host time per step that CUDA graphs do not hide: the scheduler, input
# preparation and output processing, about 1-2 ms a step at small batches with ~10 us
# more per sequence (vLLM V1 design notes; CPU-overhead study in vLLM issue #6797).
VLLM_STEP_S = 1.5e-3
VLLM_PER_ROW_S = 10e-6


def splitwise_per_kernel_s(gpu: str) -> float:
    """Host dispatch time per kernel of Splitwise's eager engine on `gpu`: the value that
    leaves the median BLOOM-176B decode step error at zero (bisection; error rises with it)."""
    shapes = known_shapes("bloom-176b")
    steps = [s for s in splitwise_steps(model="bloom-176b")
             if s.gpu == gpu and s.phase == "decode"]
    plans = [(s.plan(), s.tp, s.measured_s) for s in steps]

    def median_error(kernel_s: float) -> float:
        engine = EngineOverhead("probe", 0.0, kernel_s, 0.0, "")
        models = {tp: GpuCostModel(shapes, known_gpu(gpu), engine, tensor_parallel=tp)
                  for tp in {tp for _, tp, _ in plans}}
        return float(np.median([(models[tp].predict(plan) - m) / m for plan, tp, m in plans]))

    lo, hi = 0.0, 1e-3
    if median_error(lo) >= 0.0:
        return 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if median_error(mid) < 0.0 else (lo, mid)
    return (lo + hi) / 2


def engine_entries(data: dict) -> dict:
    """The 'engines' section of the fit file (needs the GPU terms already written)."""
    splitwise = {gpu: splitwise_per_kernel_s(gpu) for gpu in ("a100-80gb", "h100")}
    return {
        "vllm": {"_what": "vLLM V1 (CUDA graphs, async scheduling): host time per step and "
                          "per sequence, overlapped with the GPU's step",
                 "step_s": VLLM_STEP_S, "per_kernel_s": 0.0, "per_row_s": VLLM_PER_ROW_S,
                 "overlapped": True,
                 "source": "published vLLM V1 overhead figures (not fitted)"},
        **{f"splitwise-{gpu}": {
            "_what": "Splitwise's eager engine: host dispatch time per kernel",
            "step_s": 0.0, "per_kernel_s": per_kernel, "per_row_s": 0.0,
            "source": f"Splitwise BLOOM-176B steps on {gpu} (zero median error)"}
           for gpu, per_kernel in splitwise.items()},
    }
