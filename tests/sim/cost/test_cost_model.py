"""Sanity tests of the analytic roofline cost model against known regimes and magnitudes."""

from __future__ import annotations

import dataclasses
import pickle
from itertools import pairwise

import pytest

from sim.cost.roofline import AnalyticCostModel
from sim.engine.core import BatchPlan, Request, StepResult
from sim.specs.hardware import HARDWARE_SPECS, GiB, hardware_spec
from sim.specs.model_specs import model_spec


def decode_plan(batch_size: int, context_len: int) -> BatchPlan:
    """batch_size decodes, each reading context_len tokens of KV."""
    return BatchPlan(decode_seqs=batch_size, decode_context=batch_size * context_len)


def prefill_plan(num_tokens: int) -> BatchPlan:
    """One whole prompt of num_tokens, prefilled from an empty cache."""
    return BatchPlan(
        prefill_tokens=num_tokens, prefill_attn=num_tokens * num_tokens, prefill_seqs=1
    )


@pytest.fixture
def h100() -> AnalyticCostModel:
    return AnalyticCostModel.preset("llama-3-8b", "h100", "bf16")


def test_decode_batch1_on_h100_is_memory_bound_and_plausible(h100: AnalyticCostModel) -> None:
    plan = decode_plan(1, 128)
    # Memory-bound: halving the achievable FLOP/s changes nothing.
    slow_compute = dataclasses.replace(h100, flops_efficiency=h100.flops_efficiency / 2)
    assert slow_compute.predict(plan) == h100.predict(plan)
    # ~15 GB of weights at 0.8 x 3.35 TB/s is ~5.6 ms, plus ~1 ms of overhead.
    assert 5.5e-3 < h100.predict(plan) < 8e-3


def test_large_prefill_is_compute_bound_and_grows_linearly(h100: AnalyticCostModel) -> None:
    plan = prefill_plan(8192)
    slow_memory = dataclasses.replace(h100, bandwidth_efficiency=h100.bandwidth_efficiency / 2)
    assert slow_memory.predict(plan) == h100.predict(plan)
    # 16e9 FLOPs a token at ~0.6 x 989 TFLOP/s: about a quarter second for 8192 tokens.
    assert 0.15 < h100.predict(plan) < 0.5
    # Linear in tokens, plus a little quadratic attention on top.
    ratio = h100.predict(prefill_plan(8192)) / h100.predict(prefill_plan(4096))
    assert 1.9 < ratio < 2.4


def test_decode_time_grows_with_context_read(h100: AnalyticCostModel) -> None:
    short, long = h100.predict(decode_plan(32, 1024)), h100.predict(decode_plan(32, 8192))
    # 32 x 7168 more tokens x 128 KiB each: ~30 GB more to read at ~2.7 TB/s.
    assert long - short == pytest.approx(32 * 7168 * 128 * 1024 / (3.35e12 * 0.8), rel=0.05)


def test_decode_time_grows_slowly_with_batch_while_memory_bound(
    h100: AnalyticCostModel,
) -> None:
    one, eight = h100.predict(decode_plan(1, 128)), h100.predict(decode_plan(8, 128))
    assert one < eight < 1.1 * one


def test_padding_row_costs_exactly_a_decode_row(h100: AnalyticCostModel) -> None:
    live, done = Request("live", 0.0, 100, 10), Request("done", 0.0, 100, 10)
    two_decodes = BatchPlan(
        num_scheduled_tokens={"live": 1, "done": 1},
        requests=[live, done],
        decode_seqs=2,
        decode_context=2 * 200,
    )
    one_padded = BatchPlan(
        num_scheduled_tokens={"live": 1},
        requests=[live],
        padding=[done],
        decode_seqs=2,
        decode_context=2 * 200,
    )
    assert h100.predict(one_padded) == h100.predict(two_decodes)
    assert h100.predict(one_padded) > h100.predict(decode_plan(1, 200))


def test_mixed_batch_costs_at_least_each_part(h100: AnalyticCostModel) -> None:
    chunk = prefill_plan(512)
    mixed = BatchPlan(
        prefill_tokens=512,
        prefill_attn=512 * 512,
        prefill_seqs=1,
        decode_seqs=64,
        decode_context=64 * 2048,
    )
    assert mixed.num_tokens == 576
    assert h100.predict(mixed) > max(h100.predict(chunk), h100.predict(decode_plan(64, 2048)))


def test_faster_memory_means_faster_decode() -> None:
    plan = decode_plan(32, 1024)
    a100, h100, h200 = (
        AnalyticCostModel.preset(hardware_name=name).predict(plan)
        for name in ("a100-80gb", "h100", "h200")
    )
    assert h200 < h100 < a100


def test_empty_plan_costs_nothing(h100: AnalyticCostModel) -> None:
    assert h100.predict(BatchPlan()) == 0.0
    assert h100.predict(BatchPlan(preempted=["r1"])) == 0.0


def test_execute_is_a_backend_step(h100: AnalyticCostModel) -> None:
    plan = decode_plan(4, 512)
    result = h100.execute(plan)
    assert isinstance(result, StepResult)
    assert result.duration_s == h100.predict(plan)
    assert result.sampled_token_ids is None
    h100.free(Request("r", 0.0, 10, 10))  # no state to forget: must not raise


@pytest.mark.parametrize(("tp", "crossing"), [(1, 256 * 64), (4, 256 * 256)])
def test_decode_steps_are_priced_to_the_bit_as_their_plans(tp: int, crossing: int) -> None:
    model = AnalyticCostModel.preset("llama-3-70b" if tp > 1 else "llama-3-8b", "h100", "bf16",
                                     tensor_parallel=tp)
    for rows, context in [(1, 7), (3, 100), (28, 30_000), (256, crossing)]:
        durations = model.decode_steps_s(rows, context, 40)
        plans = [BatchPlan(decode_seqs=rows, num_sampled=rows, unlisted_decodes=rows,
                           decode_context=context + rows * j) for j in range(40)]
        assert durations == [model.predict(plan) for plan in plans]  # exact, not approximate
    # 256 rows over `crossing` tokens turn from compute- to memory-bound within the run: the
    # time per step grows at two rates, and both branches were priced above.
    growth = [b - a for a, b in pairwise(durations)]
    assert max(growth) > 2 * min(growth) > 0
    with pytest.raises(ValueError, match="rows must be >= 1"):
        model.decode_steps_s(0, 0, 4)


def test_kv_pool_blocks_llama3_8b_on_h100(h100: AnalyticCostModel) -> None:
    weight_bytes = model_spec("llama-3-8b").num_params * 2
    assert weight_bytes == pytest.approx(16.06e9, rel=0.01)
    block_bytes = 128 * 1024 * 16  # 128 KiB of K+V per token, 16 tokens a block
    expected = (0.9 * 80 * GiB - weight_bytes - h100.reserve_bytes) // block_bytes
    assert h100.kv_pool_blocks(16) == expected
    # The reserve profiled at servelab's defaults (2,048 tokens, 256 sequences): 366 MiB of
    # non-torch memory and the sampler's 256 x 128,256 logits x 26 B.
    assert h100.reserve_bytes == 366 * 2**20 + 256 * 128_256 * 26
    assert h100.kv_pool_blocks(32) == (0.9 * 80 * GiB - weight_bytes - h100.reserve_bytes) // (
        2 * block_bytes
    )
    assert h100.kv_pool_blocks(16, memory_utilization=0.5) < h100.kv_pool_blocks(16)


def test_weights_that_do_not_fit_raise() -> None:
    cost = AnalyticCostModel.preset("llama-3-70b", "a100-80gb")
    with pytest.raises(ValueError, match="llama-3-70b.*does not fit on a100-80gb"):
        cost.kv_pool_blocks(16)


@pytest.mark.parametrize("block_size, utilization", [(0, 0.9), (16, 0.0), (16, 1.5)])
def test_kv_pool_blocks_rejects_bad_arguments(
    h100: AnalyticCostModel, block_size: int, utilization: float
) -> None:
    with pytest.raises(ValueError, match="kv_pool_blocks"):
        h100.kv_pool_blocks(block_size, utilization)


def test_unknown_names_raise_with_known_list() -> None:
    with pytest.raises(ValueError, match="unknown hardware preset 'tpu'.*a100-80gb, h100, h200"):
        hardware_spec("tpu")
    with pytest.raises(ValueError, match="unknown model preset 'gpt-5'.*llama-3-8b"):
        AnalyticCostModel.preset(model_name="gpt-5")
    with pytest.raises(ValueError, match="unknown dtype 'fp8'.*bf16"):
        AnalyticCostModel.preset(dtype="fp8")


@pytest.mark.parametrize(
    "changes",
    [
        {"flops_efficiency": 0.0},
        {"bandwidth_efficiency": 1.2},
        {"overhead_s": -1e-3},
        {"reserve_bytes": -1},
    ],
)
def test_bad_config_raises(h100: AnalyticCostModel, changes: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="AnalyticCostModel"):
        dataclasses.replace(h100, **changes)


def test_presets_are_all_usable_and_picklable() -> None:
    plan = BatchPlan(
        prefill_tokens=256,
        prefill_attn=256 * 1024,
        prefill_seqs=1,
        decode_seqs=8,
        decode_context=8 * 512,
    )
    for name in ("tiny", "qwen2.5-0.5b", "llama-3-8b"):
        for hardware in HARDWARE_SPECS:
            cost = AnalyticCostModel.preset(name, hardware)
            assert cost.predict(plan) > cost.overhead_s
            assert cost.kv_pool_blocks(16) > 0
            # Sweeps hand cost models to worker processes.
            assert pickle.loads(pickle.dumps(cost)).predict(plan) == cost.predict(plan)
