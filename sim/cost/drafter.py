"""The drafter's time in a speculative step: a draft model's, an EAGLE head's or an MTP
layer's forward passes, priced per step from the plan and added to the target's step time.

A step whose rows verify up to k proposals runs the drafter k times before the target's
verify pass, as vLLM does, inside the same engine step (so its passes cost GPU time, not the
engine's per-step host time again): the first pass over every row the target computes (the prompt
chunks the drafter must also read, each verifying row's newest token), then k - 1 one-token
passes over the rows that still propose, each batched over those rows. The drafter is a
ModelSpec priced by the same kind of cost model as the target, on the same hardware: a
draft model's own shape, or one decoder layer of the target's width with the LM head
(EAGLE, MTP), or the target's first N layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from sim.cost.calibrated import CalibratedCostModel, feature_names
from sim.cost.gpu_cost import GpuCostModel, gpu_cost_backend
from sim.cost.kernel_cost import KernelCostModel, kernel_cost_backend
from sim.cost.roofline import AnalyticCostModel
from sim.engine.batch_plan import add_to_plan
from sim.engine.core import (
    Backend,
    BatchPlan,
    Request,
    StepResult,
    request_overhead_s,
    row_knots,
)
from sim.engine.speculation.config import SpeculativeConfig
from sim.specs.hardware import HardwareSpec
from sim.specs.model_config import resolve_model
from sim.specs.model_specs import ModelSpec


class DrafterCostError(ValueError):
    """A drafter that cannot be priced, naming what is missing."""


class PricesPlans(Protocol):
    """A cost model's median step time for a plan (every cost model has one)."""

    def predict(self, plan: BatchPlan) -> float: ...


@dataclass(frozen=True)
class TargetPricing:
    """How the target is priced: the drafter is priced alike, on the same GPUs."""

    cost_model: Backend  # the target's cost model
    model: ModelSpec
    hardware: HardwareSpec | None  # None: a calibration (no GPU to price a shape on)
    dtype: str = "bf16"
    tensor_parallel: int = 1


def drafter_spec(config: SpeculativeConfig, target: ModelSpec) -> ModelSpec:
    """The drafter's shape: the named draft model, the target's first draft_num_layers
    layers, or (eagle, eagle3, mtp) one decoder layer of the target's shapes and its LM head."""
    if config.method == "draft_model":
        if config.draft_num_layers is not None:
            if config.draft_num_layers > target.num_layers:
                raise DrafterCostError(f"draft_num_layers {config.draft_num_layers}: the "
                                       f"target {target.name} has {target.num_layers} layers")
            return first_layers(target, config.draft_num_layers,
                                f"{target.name} first {config.draft_num_layers} layers")
        try:
            drafter = resolve_model(str(config.model))
        except (ValueError, KeyError, OSError) as error:
            raise DrafterCostError(f"draft model {config.model!r}: {error}") from None
        if drafter.vocab_size != target.vocab_size:
            raise DrafterCostError(f"draft model {config.model!r} has a vocabulary of "
                                   f"{drafter.vocab_size}, the target {target.vocab_size}")
        return drafter
    return first_layers(target, 1, f"{target.name} {config.method} head")


def first_layers(spec: ModelSpec, num_layers: int, name: str) -> ModelSpec:
    """spec cut to its first num_layers decoder layers (embedding and LM head kept). An MoE
    model keeps at least one MoE layer: a one-layer head of DeepSeek-V3 is its MTP module,
    an MoE block, though the model's first layers are dense."""
    sliding = min(spec.num_sliding_layers, num_layers - 1)
    return replace(spec, name=name, num_layers=num_layers,
                   num_dense_layers=min(spec.num_dense_layers, num_layers - 1),
                   num_sliding_layers=sliding, sliding_window=spec.sliding_window if sliding else 0)


def drafter_cost(config: SpeculativeConfig, target: TargetPricing) -> DrafterCost:
    """The drafter's cost: its calibration file (draft_cost_model) if given, else its shape
    priced the way the target is (fitted GPU model, measured kernels, roofline)."""
    if config.draft_cost_model is not None:
        try:
            model = CalibratedCostModel.load(config.draft_cost_model)
        except (OSError, ValueError, KeyError) as error:
            raise DrafterCostError(
                f"draft_cost_model {config.draft_cost_model}: {error}") from None
        return DrafterCost(model, f"calibration {config.draft_cost_model}")
    cost = target.cost_model
    if isinstance(cost, CalibratedCostModel):
        return calibrated_drafter(config, cost)
    if target.hardware is None or not isinstance(cost, (GpuCostModel, AnalyticCostModel)):
        raise DrafterCostError(
            f"speculative method {config.method!r} on this cost model: the drafter's steps "
            "need their own calibration; add \"draft_cost_model\": FILE (servelab "
            "calibrate --model DRAFTER --out FILE) to --speculative-config")
    spec = drafter_spec(config, target.model)
    return DrafterCost(_priced_like(cost, spec, target), f"{spec.name}, {spec.num_layers} "
                       f"layers, priced by {type(cost).__name__}")


def calibrated_drafter(config: SpeculativeConfig, cost: CalibratedCostModel) -> DrafterCost:
    """A drafter of the target's shape on an executor calibration: its passes priced from
    the calibration's `drafter_passes` (the executor's drafter profiled with the target's
    first layer and with all its layers), linear in the drafter's layers between them."""
    record = cost.meta.get("drafter_passes")
    if not record:
        raise DrafterCostError(
            f"speculative method {config.method!r}: this calibration has no drafter passes "
            "(calibrated before `servelab calibrate` profiled them); calibrate again, or add "
            "\"draft_cost_model\": FILE (the drafter's own calibration)")
    depth = _drafter_depth(config, str(cost.meta.get("model")), int(record["target_layers"]))
    return DrafterCost(pass_model(record, depth, "first"),
                       f"{depth} of the target's {record['target_layers']} layers, priced by "
                       "the calibration's drafter passes", pass_model(record, depth, "later"),
                       DrafterKv())


def pass_model(record: dict, depth: int, which: str) -> CalibratedCostModel:
    """A drafter pass of `depth` layers (`which`: "first" or "later"): the pass fits of one
    layer and of the target's layers (a calibration's drafter_passes) weighed linearly in
    layers, so their difference is what the layers cost and the rest (inputs, embedding, LM
    head, argmax) is fixed."""
    knots = tuple(int(k) for k in record["row_knots"])
    depths = sorted(int(n) for n in record["layers"])
    low = record["layers"][str(depths[0])][which]
    high = record["layers"][str(depths[-1])][which]
    share = (depth - depths[0]) / (depths[-1] - depths[0]) if depths[-1] > depths[0] else 0.0
    coefficients = tuple(max(0.0, low[name] + (high[name] - low[name]) * share)
                         for name in feature_names(knots))
    return CalibratedCostModel(coefficients, knots)


def _drafter_depth(config: SpeculativeConfig, target_name: str, target_layers: int) -> int:
    """The drafter's layers, for a drafter of the calibrated target's width: draft_num_layers,
    one for an EAGLE or MTP head, or a named draft model's if its shape is the target's."""
    if config.method != "draft_model":
        return 1
    if config.draft_num_layers is not None:
        if config.draft_num_layers > target_layers:
            raise DrafterCostError(f"draft_num_layers {config.draft_num_layers}: the "
                                   f"calibrated target has {target_layers} layers")
        return config.draft_num_layers
    try:
        drafter, target = resolve_model(str(config.model)), resolve_model(target_name)
    except (ValueError, KeyError, OSError) as error:
        raise DrafterCostError(f"draft model {config.model!r} on a calibration: {error}; add "
                               "\"draft_cost_model\": FILE (its own calibration)") from None
    if replace(drafter, name=target.name, num_layers=target.num_layers) != target:
        raise DrafterCostError(
            f"draft model {config.model!r} is not the calibrated {target_name}'s shape "
            "with other layers; add \"draft_cost_model\": FILE (its own calibration)")
    return drafter.num_layers


def _priced_like(cost: Backend, spec: ModelSpec, target: TargetPricing) -> PricesPlans:
    """spec priced by the target's kind of cost model, its GPU time only: the drafter's
    passes run inside the engine's step, whose host time (scheduling, input preparation,
    bookkeeping) the target's step already pays once."""
    hw, tp = target.hardware, target.tensor_parallel
    assert hw is not None  # (drafter_cost checked)
    if isinstance(cost, GpuCostModel):
        if isinstance(cost, KernelCostModel):
            model = kernel_cost_backend(spec, hw, cost.tables, tp, dtype=target.dtype)
        else:
            model = gpu_cost_backend(spec, hw, tp)
        model.use_engine(replace(model.engine, step_s=0.0, per_row_s=0.0, request_s=0.0))
        return model
    return AnalyticCostModel(spec, hw, target.dtype, tensor_parallel=tp, overhead_s=0.0)


class DrafterKv:
    """The executor's drafter KV, mirrored: per request, the positions it holds. The executor's
    drafter computes no prompt chunk; at a row's first verify its pass 1 computes the whole
    sequence, later the tokens past the prefix its KV still matches: through its accepted
    proposals (their KV was computed when they were proposed), so one token, or two when
    all k were accepted (the k-th proposal never got KV)."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def first_pass(self, plan: BatchPlan) -> BatchPlan:
        """Pass 1 as the executor's drafter runs it: each verifying row's tokens past its KV;
        the KV then holds the row's sequence and its first k - 1 proposals."""
        for request_id in plan.preempted:
            self._held.pop(request_id, None)
        out = BatchPlan()
        for request in plan.requests:
            k = plan.num_spec_tokens.get(request.request_id)
            if k is None:
                continue
            length = request.num_tokens
            held = min(self._held.get(request.request_id, 0), length - 1)
            row = Request(request.request_id, 0.0, length, 1)
            row.num_computed_tokens = held
            add_to_plan(out, row, length - held)
            self._held[request.request_id] = length + k - 1
        return out

    def forget(self, request_id: str) -> None:
        """The request finished: its drafter KV is freed."""
        self._held.pop(request_id, None)


@dataclass(frozen=True)
class DrafterCost:
    """Prices the drafter's passes of one step (see the module docstring)."""

    model: PricesPlans  # the drafter's pass 1 (and its later passes, unless `later`)
    description: str = ""  # what the drafter is and what prices it, for the summary
    later: PricesPlans | None = None  # passes 2..k, where fitted apart from pass 1
    # The executor's drafter (an executor calibration prices it): pass 1 computes each
    # verifying row's tokens past its own KV, none of the plan's prompt chunks. None: vLLM's
    # first pass over every token the target computes.
    kv: DrafterKv | None = None

    def step_s(self, plan: BatchPlan) -> float:
        """Seconds the drafter adds to the step of `plan`."""
        spec = plan.num_spec_tokens
        if not plan.requests and not plan.unlisted_decodes:
            return 0.0
        first = first_pass(plan) if self.kv is None else self.kv.first_pass(plan)
        total = self.model.predict(first) if first.requests or first.unlisted_decodes else 0.0
        later = self.model if self.later is None else self.later
        contexts = [(r.num_computed_tokens + 1, spec[r.request_id]) for r in plan.requests
                    if r.request_id in spec]
        for j in range(1, max((k for _, k in contexts), default=0)):
            rows = [ctx + j for ctx, k in contexts if k > j]  # proposal j + 1's KV length
            total += later.predict(decode_plan(rows))
        return total

    def free(self, request: Request) -> None:
        """Forget the request's drafter KV (an executor's drafter keeps one)."""
        if self.kv is not None:
            self.kv.forget(request.request_id)


def first_pass(plan: BatchPlan) -> BatchPlan:
    """The drafter's first pass: the plan with each verifying row's (k + 1)-token chunk
    replaced by a decode of its newest token (its proposals do not exist yet)."""
    return verify_as_decodes(plan, over_proposals=False)


def verify_as_decodes(plan: BatchPlan, over_proposals: bool = True) -> BatchPlan:
    """The plan with each verifying row's (k + 1)-token chunk replaced by a one-token decode
    over the row's KV: through its proposals (over_proposals, the verify's KV), or through its
    newest token only."""
    out = BatchPlan(requests=plan.requests, unlisted_decodes=plan.unlisted_decodes,
                    prefill_tokens=plan.prefill_tokens, prefill_attn=plan.prefill_attn,
                    prefill_attn_causal=plan.prefill_attn_causal,
                    prefill_seqs=plan.prefill_seqs, prefill_chunk_max=plan.prefill_chunk_max,
                    prefill_context_max=plan.prefill_context_max,
                    decode_seqs=plan.decode_seqs, num_sampled=plan.num_sampled,
                    decode_context=plan.decode_context,
                    decode_context_max=plan.decode_context_max)
    for request in plan.requests:
        k = plan.num_spec_tokens.get(request.request_id)
        if k is None:
            continue
        n, ctx = k + 1, request.num_computed_tokens + k + 1
        out.prefill_tokens -= n
        out.prefill_attn -= n * ctx
        out.prefill_attn_causal -= n * ctx - n * (n - 1) // 2
        out.prefill_seqs -= 1
        out.decode_seqs += 1
        out.num_sampled -= k  # a decode's one logits row, not the verify's k + 1
        read = ctx if over_proposals else ctx - k
        out.decode_context += read
        out.decode_context_max = max(out.decode_context_max, read)
    return out


def decode_plan(contexts: list[int]) -> BatchPlan:
    """A decode-only plan of one row per KV length in contexts (rows left unlisted)."""
    return BatchPlan(unlisted_decodes=len(contexts), decode_seqs=len(contexts),
                     num_sampled=len(contexts), decode_context=sum(contexts),
                     decode_context_max=max(contexts))


class SpeculativeCostModel:
    """A Backend for speculative steps: the target's cost model with a verify floor, plus the
    drafter's passes in every step (none for ngram).

    The floor: a step whose rows verify proposals costs at least the same step with those
    rows decoding one token over the same KV, since it reads the same weights and KV and
    computes more queries. Cost models that price a chunk's attention by its (query, key)
    pairs at compute speed price a short chunk over a long context below a decode of it
    (the fitted GPU model: ~0.4 us against ~3.2 us a layer for 5 queries over 2000 keys),
    so without the floor a verify step came out cheaper than the decode it replaces."""

    reads_rows = True  # the floor and the drafter read each verifying row's context

    def __init__(self, target: Backend, drafter: DrafterCost | None = None) -> None:
        self.target = target
        self.drafter = drafter

    @property
    def request_overhead_s(self) -> float:
        return request_overhead_s(self.target)

    @property
    def row_knots(self) -> tuple[int, ...]:
        return row_knots(self.target)

    def execute(self, plan: BatchPlan) -> StepResult:
        """The target's step time, at least the decode floor, plus the drafter's."""
        seconds = self.target.execute(plan).duration_s
        if plan.num_spec_tokens:
            floor = self.target.execute(verify_as_decodes(plan)).duration_s
            seconds = seconds if seconds > floor else floor
        if self.drafter is not None:
            seconds += self.drafter.step_s(plan)
        return StepResult(seconds)

    def free(self, request: Request) -> None:
        """The target's per-request state, and the drafter's."""
        self.target.free(request)
        if self.drafter is not None:
            self.drafter.free(request)
