"""The drafter's passes and the verify floor (sim.cost.drafter): what a speculative step
adds to the target's time, from the plan."""

from __future__ import annotations

import pytest

from sim.cost.drafter import (
    DrafterCost,
    DrafterCostError,
    SpeculativeCostModel,
    TargetPricing,
    drafter_cost,
    drafter_spec,
    verify_as_decodes,
)
from sim.cost.gpu_cost import gpu_cost_backend
from sim.engine.batch_plan import add_to_plan, add_verify, remove_from_plan
from sim.engine.core import BatchPlan, Request
from sim.engine.speculation.config import SpeculativeConfig
from sim.specs.hardware import hardware_spec
from sim.specs.model_config import resolve_model


class PerToken:
    """A cost model: 1 s a step plus 1 ms a token, for counting passes and tokens."""

    def predict(self, plan: BatchPlan) -> float:
        return 1.0 + 1e-3 * (plan.prefill_tokens + plan.decode_seqs)


def _request(rid: str, computed: int) -> Request:
    request = Request(rid, 0.0, computed + 1, 64)
    request.num_computed_tokens = computed
    return request


def _verify_plan(ks: list[int], context: int = 2000) -> BatchPlan:
    plan = BatchPlan()
    for i, k in enumerate(ks):
        add_verify(plan, _request(f"r{i}", context), k, ())
    return plan


def test_a_step_runs_the_drafter_k_times_over_the_rows_that_still_propose():
    plan = _verify_plan([3, 1])
    add_to_plan(plan, Request("p", 0.0, 100, 8), 100)  # a prompt chunk the drafter reads too
    seconds = DrafterCost(PerToken()).step_s(plan)
    # pass 1: 100 prompt tokens + one token per verifying row; passes 2, 3: only r0
    assert seconds == pytest.approx((1 + 0.102) + 2 * (1 + 0.001))


def test_a_step_without_rows_costs_the_drafter_nothing():
    assert DrafterCost(PerToken()).step_s(BatchPlan()) == 0.0


def test_verify_floor_keeps_a_verify_step_at_least_a_decode_step():
    """The fitted GPU model prices 5 queries over 2000 keys below a decode over them; the
    floor prices the verify step at least as the decode step of the same rows."""
    target = gpu_cost_backend(resolve_model("llama-3-8b"), hardware_spec("h100"))
    plan = _verify_plan([4] * 8)
    decode = target.predict(verify_as_decodes(plan))
    assert target.predict(plan) < decode  # what the floor is for
    assert SpeculativeCostModel(target).execute(plan).duration_s == pytest.approx(decode)


def test_a_verifying_row_computes_logits_at_each_of_its_positions():
    """k + 1 logits rows (the target's token after each proposal and after the last), as
    the executor and vLLM compute them; as a decode, one."""
    plan = _verify_plan([3, 1])
    assert plan.num_sampled == 4 + 2
    assert verify_as_decodes(plan).num_sampled == 2
    remove_from_plan(plan, plan.requests[0], 4)
    assert plan.num_sampled == 2 and plan.prefill_tokens == 2


def test_the_gpu_model_prices_the_lm_head_over_every_verified_position():
    target = gpu_cost_backend(resolve_model("llama-3-8b"), hardware_spec("h100"))
    plan = _verify_plan([4] * 8)
    one_row_each = _verify_plan([4] * 8)
    one_row_each.num_spec_tokens.clear()
    added = target.predict(plan) - target.predict(one_row_each)
    assert added == pytest.approx(target.sample_s(40) - target.sample_s(8))
    assert added > 0


def test_heads_and_first_layers_take_the_targets_shapes():
    target = resolve_model("llama-3-8b")
    head = drafter_spec(SpeculativeConfig(method="eagle"), target)
    assert (head.num_layers, head.hidden_size, head.vocab_size) == (
        1, target.hidden_size, target.vocab_size)
    half = drafter_spec(SpeculativeConfig(method="draft_model", draft_num_layers=16), target)
    assert half.num_layers == 16
    with pytest.raises(DrafterCostError, match="has 32 layers"):
        drafter_spec(SpeculativeConfig(method="draft_model", draft_num_layers=40), target)
    with pytest.raises(DrafterCostError, match="vocabulary"):
        drafter_spec(SpeculativeConfig(method="draft_model", model="tiny"), target)


def test_an_mtp_head_of_a_model_with_dense_first_layers_is_one_moe_block():
    """DeepSeek-V3 keeps its first 3 layers dense; its MTP module is an MoE block."""
    target = resolve_model("deepseek-ai/DeepSeek-V3")
    assert target.num_dense_layers == 3
    head = drafter_spec(SpeculativeConfig(method="mtp", num_speculative_tokens=1), target)
    assert (head.num_layers, head.num_dense_layers, head.num_moe_layers) == (1, 0, 1)
    cut = drafter_spec(SpeculativeConfig(method="draft_model", draft_num_layers=3), target)
    assert (cut.num_dense_layers, cut.num_moe_layers) == (2, 1)


def test_a_drafter_priced_alike_costs_less_than_the_target():
    model, gpu = resolve_model("llama-3-8b"), hardware_spec("h100")
    target = gpu_cost_backend(model, gpu)
    plan = _verify_plan([1] * 8)
    head = drafter_cost(SpeculativeConfig(method="mtp", num_speculative_tokens=1),
                        TargetPricing(target, model, gpu))
    assert 0 < head.step_s(plan) < target.predict(plan)
