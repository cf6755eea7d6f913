"""Splitwise's whole-step measurements (perf_model.csv) as servelab BatchPlans.

Each row is one batch of `batch_size` prompts of `prompt_size` tokens: `prompt_time` is the
prefill of the whole batch, `token_time` the mean decode step over `token_size` new tokens.
Batch-64 prompt times are inconsistent with batch 32 (the source notes it) and are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from servelab.calibration.gpu_profiles import DATA_DIR
from sim.engine.core import BatchPlan

SPLITWISE_CSV = DATA_DIR / "splitwise" / "perf_model.csv"
SPLITWISE_GPUS = {"a100-80gb": "a100-80gb", "h100-80gb": "h100"}  # power-capped H100 left out
SPLITWISE_MODELS = {"llama2-70b": "llama-2-70b", "bloom-176b": "bloom-176b"}


@dataclass(frozen=True)
class MeasuredStep:
    """One measured step shape: median of its repeats."""

    model: str
    gpu: str
    tp: int
    phase: str  # prefill or decode
    batch: int
    prompt: int
    new_tokens: int
    measured_s: float

    def plan(self) -> BatchPlan:
        """The BatchPlan totals of this step (decode: the mean context over its tokens)."""
        b, p = self.batch, self.prompt
        if self.phase == "prefill":
            return BatchPlan(prefill_tokens=b * p, prefill_seqs=b, prefill_attn=b * p * p,
                             prefill_attn_causal=b * p * (p + 1) // 2, num_sampled=b,
                             prefill_chunk_max=p, prefill_context_max=p)
        context = p + self.new_tokens // 2
        return BatchPlan(decode_seqs=b, decode_context=b * context, num_sampled=b,
                         decode_context_max=context)


def splitwise_steps(path: Path = SPLITWISE_CSV, model: str | None = None) -> list[MeasuredStep]:
    """Median prefill and decode step per (model, GPU, TP, batch, prompt, new tokens)."""
    frame = pd.read_csv(path)
    missing = {"model", "hardware", "tensor_parallel", "batch_size", "prompt_size",
               "token_size", "prompt_time", "token_time"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    frame = frame[frame.hardware.isin(SPLITWISE_GPUS) & frame.model.isin(SPLITWISE_MODELS)]
    keys = ["model", "hardware", "tensor_parallel", "batch_size", "prompt_size", "token_size"]
    steps = []
    for key, group in frame.groupby(keys):
        name, hw, tp, batch, prompt, new = key
        name = SPLITWISE_MODELS[name]
        if model is not None and name != model:
            continue
        common = (name, SPLITWISE_GPUS[hw], int(tp))
        shape = (int(batch), int(prompt), int(new))
        if batch < 64:
            steps.append(MeasuredStep(*common, "prefill", *shape,
                                      float(group.prompt_time.median()) / 1e3))
        steps.append(MeasuredStep(*common, "decode", *shape,
                                  float(group.token_time.median()) / 1e3))
    return steps
