"""Tensor parallelism in the analytic cost model: split work, all-reduce cost, pooled memory."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from sim.cost.roofline import AnalyticCostModel
from sim.engine.core import BatchPlan
from sim.specs.hardware import GPU_HOUR_USD, HARDWARE_SPECS, GiB, gpu_hour_usd, hardware_spec
from sim.specs.model_specs import model_spec


def decode_plan(batch_size: int, context_len: int) -> BatchPlan:
    """batch_size decodes, each reading context_len tokens of KV."""
    return BatchPlan(decode_seqs=batch_size, decode_context=batch_size * context_len)


def prefill_plan(num_tokens: int) -> BatchPlan:
    """One whole prompt of num_tokens, prefilled from an empty cache."""
    return BatchPlan(
        prefill_tokens=num_tokens, prefill_attn=num_tokens * num_tokens, prefill_seqs=1
    )


def mixed_plan() -> BatchPlan:
    """A 512-token prefill chunk over 1024 tokens of context beside 64 decodes."""
    return BatchPlan(
        prefill_tokens=512,
        prefill_attn=512 * 1024,
        prefill_seqs=1,
        decode_seqs=64,
        decode_context=64 * 2048,
    )


def single_gpu_roofline(cost: AnalyticCostModel, plan: BatchPlan) -> float:
    """The one-GPU roofline as it stood before tensor parallelism, written out longhand."""
    spec = cost.model
    flops_s = cost.hardware.peak_flops * cost.flops_efficiency
    bytes_s = cost.hardware.mem_bandwidth_bytes_s * cost.bandwidth_efficiency
    embed = spec.vocab_size * spec.hidden_size
    linear = spec.num_params - (1 if spec.tie_word_embeddings else 2) * embed
    kv = spec.kv_bytes_per_token(2)
    tokens = plan.prefill_tokens + plan.decode_seqs
    compute_s = (
        2 * linear / flops_s * tokens
        + 4 * spec.num_layers * spec.num_heads * spec.head_dim / flops_s
        * (plan.prefill_attn + plan.decode_context)
        + 2 * embed / flops_s * (plan.prefill_seqs + plan.decode_seqs)
    )
    memory_s = (
        (linear + embed) * 2 / bytes_s
        + kv / bytes_s * (tokens + plan.decode_context)
        + kv / 128 / bytes_s * plan.prefill_attn
    )
    return max(compute_s, memory_s) + cost.overhead_s


@pytest.mark.parametrize("model_name", ["tiny", "qwen2.5-0.5b", "llama-3-8b"])
@pytest.mark.parametrize(
    "plan", [decode_plan(1, 128), decode_plan(64, 4096), prefill_plan(8192), mixed_plan()]
)
def test_one_gpu_predicts_exactly_the_single_gpu_roofline(
    model_name: str, plan: BatchPlan
) -> None:
    cost = AnalyticCostModel.preset(model_name, "h100", tensor_parallel=1)
    assert cost.predict(plan) == single_gpu_roofline(cost, plan)
    # No communication on one GPU, whatever the link or all-reduce latency.
    slow_link = dataclasses.replace(
        cost,
        hardware=dataclasses.replace(cost.hardware, interconnect_bytes_s=1.0),
        allreduce_latency_s=1.0,
    )
    assert slow_link.predict(plan) == cost.predict(plan)


def test_one_gpu_pool_is_the_single_gpu_budget() -> None:
    cost = AnalyticCostModel.preset("llama-3-8b", "h100")
    weight_bytes = model_spec("llama-3-8b").num_params * 2
    block_bytes = 128 * 1024 * 16  # 128 KiB of K+V per token, 16 tokens a block
    reserve = 366 * 2**20 + 256 * 128_256 * 26  # non-torch + the sampler's logits
    expected = (0.9 * 80 * GiB - weight_bytes - reserve) // block_bytes
    assert cost.kv_pool_blocks(16) == expected
    assert cost.num_gpus == 1


def test_llama3_70b_needs_several_h100s() -> None:
    with pytest.raises(ValueError, match="llama-3-70b.*does not fit on h100 x 1"):
        AnalyticCostModel.preset("llama-3-70b", "h100").kv_pool_blocks(16)
    four = AnalyticCostModel.preset("llama-3-70b", "h100", tensor_parallel=4)
    assert four.num_gpus == 4
    weight_bytes = model_spec("llama-3-70b").num_params * 2
    assert weight_bytes == pytest.approx(141e9, rel=0.01)
    # 80 layers x 8 KV heads x 128 dims x K,V x 2 bytes = 320 KiB a token, over all GPUs.
    block_bytes = 320 * 1024 * 16
    # Each GPU's reserve: non-torch memory, the tensor-parallel group's buffers, and the
    # sampler (256 x 128,256 x 26 B), larger than a layer's 2,048 x (2 x 8,192 + 3 x 7,168) x 2 B.
    assert 2048 * (2 * 8192 + 3 * 7168) * 2 < 256 * 128_256 * 26
    reserve = 366 * 2**20 + 256 * 2**20 + 256 * 128_256 * 26
    assert four.reserve_bytes == reserve
    expected = (4 * 0.9 * 80 * GiB - weight_bytes - 4 * reserve) // block_bytes
    assert four.kv_pool_blocks(16) == expected
    assert four.kv_pool_blocks(16) > 25_000  # ~470k tokens of KV


def test_more_gpus_give_a_larger_pool() -> None:
    four = AnalyticCostModel.preset("llama-3-70b", "h100", tensor_parallel=4)
    eight = AnalyticCostModel.preset("llama-3-70b", "h100", tensor_parallel=8)
    # Eight GPUs add 4 x 72 GiB of budget and store the same weights: well over 2x the KV.
    assert eight.kv_pool_blocks(16) > 2 * four.kv_pool_blocks(16)


def test_large_prefill_on_two_gpus_takes_half_plus_the_all_reduces() -> None:
    one = AnalyticCostModel.preset("llama-3-8b", "h100")
    two = AnalyticCostModel.preset("llama-3-8b", "h100", tensor_parallel=2)
    plan = prefill_plan(8192)
    ratio = (two.predict(plan) - two.overhead_s) / (one.predict(plan) - one.overhead_s)
    assert 0.5 < ratio < 0.6
    # Compute-bound on both, so the GPU part halves exactly; the rest is communication:
    # 65 ring all-reduces (2 per layer + embedding) of 8192 x 4096 bf16, each moving
    # 2 (tp - 1) / tp of it at 450 GB/s; a logits gather of half a row; 66 latencies.
    halved_s = (one.predict(plan) - one.overhead_s) / 2
    all_reduce_s = 65 * (8192 * 4096 * 2) * 1.0 / 450e9
    gather_s = 128256 * 2 * 0.5 / 450e9
    expected = halved_s + all_reduce_s + gather_s + 66 * two.allreduce_latency_s
    assert two.predict(plan) - two.overhead_s == pytest.approx(expected, rel=1e-9)


def test_decode_speeds_up_with_gpus_but_less_than_linearly() -> None:
    plan = decode_plan(1, 128)
    step_s = {
        tp: AnalyticCostModel.preset("llama-3-8b", "h100", tensor_parallel=tp).predict(plan)
        for tp in (1, 2, 4, 8)
    }
    assert step_s[1] > step_s[2] > step_s[4] > step_s[8]
    # Not 2x: the per-step overhead does not shrink with tp, and the GPU time of tp 2 is
    # half of tp 1's plus 65 all-reduces' latency (their bytes are tiny at one token).
    assert step_s[1] / step_s[2] < 1.6
    overhead_s = 1e-3
    gpu_s = {tp: s - overhead_s for tp, s in step_s.items()}
    assert gpu_s[1] / 2 + 65 * 10e-6 < gpu_s[2] < gpu_s[1] / 2 + 70 * 10e-6


def test_decode_pays_more_communication_on_a_slower_link() -> None:
    plan = decode_plan(64, 1024)
    h100 = AnalyticCostModel.preset("llama-3-8b", "h100", tensor_parallel=4)
    slow = dataclasses.replace(
        h100, hardware=dataclasses.replace(h100.hardware, interconnect_bytes_s=45e9)
    )
    assert slow.predict(plan) > h100.predict(plan)


def test_kv_heads_are_replicated_once_tp_exceeds_them() -> None:
    # tiny: 4 query heads, 2 KV heads. tp 2 holds one KV head a GPU; so does tp 4.
    one, two, four = (AnalyticCostModel.preset("tiny", "h100", tensor_parallel=tp)
                      for tp in (1, 2, 4))
    kv_bytes = model_spec("tiny").kv_bytes_per_token(2)
    assert one.gpu_kv_bytes_per_token == kv_bytes
    assert two.gpu_kv_bytes_per_token == kv_bytes // 2
    assert four.gpu_kv_bytes_per_token == kv_bytes // 2
    # Reading context costs the same per GPU at tp 2 and 4, half of tp 1's.
    extra = {tp: cost.predict(decode_plan(64, 4096)) - cost.predict(decode_plan(64, 1024))
             for tp, cost in ((1, one), (2, two), (4, four))}
    assert extra[4] == pytest.approx(extra[2], rel=1e-6)
    assert extra[2] == pytest.approx(extra[1] / 2, rel=1e-6)


@pytest.mark.parametrize(
    "model_name, tp, reason",
    [
        ("llama-3-8b", 0, "must be >= 1"),
        ("llama-3-8b", 3, "must divide the model's 32 attention heads"),
        ("llama-3-8b", 16, "exceeds the 8 GPUs of one NVLink node"),
        ("qwen2.5-0.5b", 7, "2 KV heads"),  # 7 divides 14 heads but not 2 KV heads
    ],
)
def test_bad_tensor_parallel_degrees_raise(model_name: str, tp: int, reason: str) -> None:
    where = f"tensor_parallel={tp} for {model_name} on h100"
    with pytest.raises(ValueError, match=f"AnalyticCostModel: {where}: .*{reason}"):
        AnalyticCostModel.preset(model_name, "h100", tensor_parallel=tp)


def test_bad_allreduce_latency_raises() -> None:
    with pytest.raises(ValueError, match="allreduce_latency_s"):
        AnalyticCostModel(model_spec("tiny"), hardware_spec("h100"), allreduce_latency_s=-1.0)


def test_parallel_cost_model_is_picklable() -> None:
    cost = AnalyticCostModel.preset("llama-3-70b", "h200", tensor_parallel=4)
    assert pickle.loads(pickle.dumps(cost)).predict(mixed_plan()) == cost.predict(mixed_plan())


def test_presets_carry_nvlink_per_direction() -> None:
    assert hardware_spec("a100-80gb").interconnect_bytes_s == 300e9
    assert hardware_spec("h100").interconnect_bytes_s == 450e9
    assert hardware_spec("h200").interconnect_bytes_s == 450e9
    # An HGX board or a PCIe server holds 8; a GB200 NVL72 links all 72 at NVLink speed.
    assert {name: spec.max_gpus for name, spec in HARDWARE_SPECS.items()
            if spec.max_gpus != 8} == {"gb200": 72}


def test_tensor_parallelism_spans_an_nvl72_rack_but_not_an_hgx_board() -> None:
    rack = AnalyticCostModel.preset("llama-3-70b", "gb200", tensor_parallel=16)
    board = AnalyticCostModel.preset("llama-3-70b", "gb200", tensor_parallel=8)
    assert rack.predict(decode_plan(64, 2048)) < board.predict(decode_plan(64, 2048))
    with pytest.raises(ValueError, match="exceeds the 8 GPUs of one NVLink node"):
        AnalyticCostModel.preset("llama-3-70b", "b300", tensor_parallel=16)


@pytest.mark.parametrize("changes", [{"interconnect_bytes_s": 0.0}, {"max_gpus": 0}])
def test_bad_hardware_spec_raises(changes: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="hardware h100"):
        dataclasses.replace(hardware_spec("h100"), **changes)


def test_every_preset_has_a_gpu_hour_price() -> None:
    assert set(GPU_HOUR_USD) == set(HARDWARE_SPECS)
    assert gpu_hour_usd("h100") == GPU_HOUR_USD["h100"] > 0
    assert gpu_hour_usd("a100-80gb") < gpu_hour_usd("h100") <= gpu_hour_usd("h200")


def test_gpu_hour_prices_are_overridden_name_by_name() -> None:
    prices = {"h100": 1.25, "b200": 6.0}
    assert gpu_hour_usd("h100", prices) == 1.25
    assert gpu_hour_usd("b200", prices) == 6.0
    assert gpu_hour_usd("h200", prices) == GPU_HOUR_USD["h200"]


def test_gpu_hour_price_errors_name_the_known_gpus() -> None:
    with pytest.raises(ValueError, match="'tpu'.*known: a100-80gb, h100, h200"):
        gpu_hour_usd("tpu")
    with pytest.raises(ValueError, match="price of 'h100' must be > 0"):
        gpu_hour_usd("h100", {"h100": 0.0})

