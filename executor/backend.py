"""ModelBackend: the measured Backend that runs each BatchPlan through the real model.

A step's duration is the wall time of everything the backend does for it (building index
tensors, the forward, sampling), read after a CUDA synchronize, so the measured run's clock
includes the executor's own overhead.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from executor.batch import build_step_inputs, segments_from_plan
from executor.config import ModelArgs
from executor.kv_cache import KVCache
from executor.model import Transformer
from executor.native import ROW_KNOTS
from executor.sampling import Sampler
from executor.speculative.drafter import DraftModel
from executor.speculative.verify import sample_and_verify
from executor.weights import load_hf_model, random_model
from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, Request, StepResult

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(name: str | None = None) -> torch.device:
    """`cpu`, `cuda[:N]`, or None/`auto` (CUDA when available)."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r} is not supported; use cpu or cuda")
    return device


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """A dtype name, or None/`auto`: float32 on CPU, bfloat16 on CUDA."""
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}") from None


def load_model(model: str, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, seed: int = 0) -> Transformer:
    """A preset name (random weights from seed) or a Hugging Face checkpoint directory."""
    if Path(model).is_dir():
        return load_hf_model(model, device, dtype)
    return random_model(ModelArgs.from_preset(model), seed, device, dtype)


class ModelBackend:
    """Executes plans on a Transformer whose paged KV follows the scheduler's BlockManager."""

    def __init__(self, model: Transformer, block_manager: BlockManager,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None,
                 step_log: list[tuple[BatchPlan, float]] | None = None,
                 allowed_token_ids: Sequence[int] | None = None,
                 drafter: DraftModel | None = None) -> None:
        weight = model.tok_embeddings
        self.device = torch.device(device) if device is not None else weight.device
        self.dtype = dtype or weight.dtype
        if weight.device != self.device or weight.dtype != self.dtype:
            model = model.to(self.device, self.dtype)
            model.tie_weights()
            model.pack_weights()
        self.model = model
        self.block_manager = block_manager
        self.kv = KVCache(model.args, block_manager.num_blocks, block_manager.block_size,
                          self.device, self.dtype)
        # KV of requests swapped out (--preemption swap), in host memory: pinned on CUDA,
        # so the copies run at PCIe speed.
        self.host_kv = None
        if block_manager.num_host_blocks:
            shape = list(self.kv.data.shape)
            shape[3] = block_manager.num_host_blocks  # [L, 2, Hkv, host blocks, size, D]
            self.host_kv = torch.zeros(shape, dtype=self.dtype,
                                       pin_memory=self.device.type == "cuda")
        self.sampler = Sampler(self.device, allowed_token_ids)
        # If given, every executed step's (plan, seconds) is appended: what a cost model
        # is checked against (sim.cost.calibrated.in_run_step_error).
        self.step_log = step_log
        # Speculation by a draft model: it proposes the verifying rows' tokens in each step
        # (inside the measured time); None: proposals come with the plan (n-gram) or not at all.
        self.drafter = drafter

    def execute(self, plan: BatchPlan) -> StepResult:
        """Run one step: forward every scheduled token, sample where a sequence ends."""
        start = time.perf_counter()
        if plan.swap_out or plan.swap_in:
            self._swap(plan)
        self._propose(plan)
        segments = segments_from_plan(plan)
        if not segments:
            return StepResult(time.perf_counter() - start, {})
        with torch.inference_mode():
            inputs = build_step_inputs(segments, self.block_manager, self.model.args,
                                       self.device, paged=self.model.native)
            logits = self.model(inputs, self.kv)  # [S, vocab]
            produced = None
            if plan.spec_token_ids:  # 1 + k logits rows per verifying sequence
                sampled, produced = sample_and_verify(
                    self.sampler, logits, segments,
                    self.drafter.proposal_probs if self.drafter else None)
            else:
                sampling = [s.request for s in segments if s.samples]
                tokens = self.sampler.sample(logits, sampling) if sampling else []
                sampled = {r.request_id: t for r, t in zip(sampling, tokens, strict=True)}
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        duration = time.perf_counter() - start
        if self.step_log is not None:
            self.step_log.append((plan, duration))
        return StepResult(duration, sampled, produced)

    def _propose(self, plan: BatchPlan) -> None:
        """The drafter's proposals for rows that verify without ids (a draft model's)."""
        if self.drafter is not None:
            with torch.inference_mode():
                self.drafter.propose(plan)
        elif len(plan.spec_token_ids) != len(plan.num_spec_tokens):
            raise ValueError("a plan verifies proposals no one made: this speculative method "
                             "needs a drafter on the executor (draft_model has one)")

    @property
    def row_knots(self) -> tuple[int, ...]:
        """Where a decode step's cost changes slope with its rows, for the cost model: the
        native GEMM's tile edges (ROW_KNOTS); none on the torch path, tiled by oneDNN."""
        return ROW_KNOTS if self.model.native else ()

    def _swap(self, plan: BatchPlan) -> None:
        """Copy evicted requests' KV to host memory, then resumed ones' back: outs first,
        since this step may hand an evicted request's blocks to a resumed one."""
        assert self.host_kv is not None, "a swap planned without host memory"
        data, host = self.kv.data, self.host_kv
        for _, device_blocks, host_blocks in plan.swap_out:
            host[:, :, :, host_blocks] = data[:, :, :, device_blocks].to("cpu")
        for _, host_blocks, device_blocks in plan.swap_in:
            data[:, :, :, device_blocks] = host[:, :, :, host_blocks].to(data.device)

    def free(self, request: Request) -> None:
        """Drop the request's sampling generator; its KV blocks belong to the BlockManager."""
        self.sampler.free(request.request_id)
        if self.drafter is not None:
            self.drafter.free(request.request_id)
