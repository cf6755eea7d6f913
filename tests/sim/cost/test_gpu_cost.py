"""The fitted GPU cost model: non-negative terms, physics-monotone step times, coverage."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.cost.engine_overhead import EngineOverhead, load_engine
from sim.cost.gpu_cost import GpuCostModel
from sim.cost.gpu_shapes import LayerShapes, known_gpu, known_shapes
from sim.cost.gpu_terms import coverage, load_terms
from sim.engine.core import BatchPlan
from sim.specs.model_config import resolve_model

GPUS = ("a100-80gb", "h100", "rtx-4090", "rtx-pro-6000", "h200")


def _model(gpu: str = "h100", model: str = "llama-3-8b", tp: int = 1) -> GpuCostModel:
    return GpuCostModel(known_shapes(model), known_gpu(gpu), load_engine("vllm"),
                        tensor_parallel=tp)


def _prefill(tokens: int) -> BatchPlan:
    return BatchPlan(prefill_tokens=tokens, prefill_seqs=1,
                     prefill_attn_causal=tokens * (tokens + 1) // 2, num_sampled=1)


def _decode(rows: int, context: int) -> BatchPlan:
    return BatchPlan(decode_seqs=rows, decode_context=rows * context, num_sampled=rows)


@pytest.mark.parametrize("gpu", GPUS)
def test_fitted_terms_are_non_negative_and_efficiencies_bounded(gpu):
    terms = load_terms(gpu, known_gpu(gpu))
    assert all(0 < e <= 1.2 for e in terms.gemm_eff_compute + terms.gemm_eff_memory)
    assert terms.small_op_floor_s >= 0 and terms.attn_decode_floor_s >= 0
    assert terms.sampler_per_row_s >= 0
    assert all(lat >= 0 and bw > 0 for lat, bw in terms.allreduce.values())


@pytest.mark.parametrize("gpu", GPUS)
def test_step_time_grows_with_prefill_tokens_and_decode_context(gpu):
    model = _model(gpu)
    prefill = [model.predict(_prefill(n)) for n in range(1, 4097, 7)]
    assert all(b >= a for a, b in zip(prefill, prefill[1:], strict=False))
    decode = [model.predict(_decode(8, c)) for c in range(16, 8192, 64)]
    assert all(b >= a for a, b in zip(decode, decode[1:], strict=False))
    rows = [model.predict(_decode(r, 512)) for r in range(1, 257)]
    assert all(b >= a for a, b in zip(rows, rows[1:], strict=False))


def test_all_reduce_grows_with_message_size():
    terms = load_terms("h100", known_gpu("h100"))
    sizes = [2**i for i in range(10, 28)]
    times = [terms.allreduce_s(s, 8) for s in sizes]
    assert all(b > a for a, b in zip(times, times[1:], strict=False))
    assert terms.allreduce_s(1 << 20, 1) == 0.0


def test_engine_overhead_is_its_own_term():
    shapes, gpu = known_shapes("llama-3-8b"), known_gpu("h100")
    bare = GpuCostModel(shapes, gpu, EngineOverhead("none", 0.0, 0.0, 0.0, ""))
    slow = GpuCostModel(shapes, gpu, EngineOverhead("cpu", 5e-3, 0.0, 0.0, ""))
    plan = _decode(1, 100)
    assert slow.predict(plan) == pytest.approx(bare.predict(plan) + 5e-3)


def test_decode_steps_match_predict_bit_for_bit():
    model = _model("rtx-pro-6000", "qwen3-32b", tp=2)
    steps = model.decode_steps_s(rows=12, context=12 * 300, num_steps=5)
    assert steps == [model.predict(_decode(12, 300 + i)) for i in range(5)]


def test_moe_prices_fewer_experts_than_dense_equivalent():
    moe = _model("rtx-pro-6000", "qwen3-30b-a3b")
    assert moe.predict(_decode(1, 100)) < _model("rtx-pro-6000", "qwen3-32b").predict(
        _decode(1, 100))
    times = [moe.mlp_s(n) for n in (1, 2, 8, 64, 512, 2048)]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))


def test_coverage_says_when_the_answer_is_extrapolated():
    assert "extrapolated from its datasheet" in coverage("llama-3-8b", "b200", 2048)
    assert "model profiled" in coverage("meta-llama/Llama-3.1-8B", "rtx-4090", 2048)


def test_bad_parallelism_is_rejected_with_the_field_named():
    with pytest.raises(ValueError, match="tensor_parallel"):
        _model(tp=3)
    with pytest.raises(ValueError, match="expert_parallel"):
        GpuCostModel(known_shapes("llama-3-8b"), known_gpu("h100"), load_engine("vllm"),
                     expert_parallel=2)


@pytest.mark.parametrize("model_name,grouped", [("llama-3-8b", True), ("llama-2-7b", False)])
def test_decode_rows_beside_a_prefill_chunk_cost_their_re_reads(model_name, grouped):
    """A mixed step's decode attention costs the decode-only price x the fitted factor: more
    with grouped-query heads (the varlen kernel re-reads KV per query head), the same with MHA."""
    model, plain = _model("rtx-pro-6000", model_name), _model("rtx-pro-6000", model_name)
    table = plain.terms.mixed_extra
    plain.terms = replace(plain.terms, mixed_extra=tuple((0.0,) * len(r) for r in table))
    chunk, rows, context = 512, 64, 1024
    mixed = BatchPlan(prefill_tokens=chunk, prefill_seqs=1, decode_seqs=rows,
                      prefill_attn_causal=chunk * (chunk + 1) // 2,
                      decode_context=rows * context, num_sampled=rows + 1)
    kv_s = model._s_per_decode_kv * rows * context * model._layers
    factor = model.terms.mixed_decode_factor(rows, context, model._group)
    assert model.predict(mixed) - plain.predict(mixed) == pytest.approx(kv_s * (factor - 1))
    assert (factor > 1.2) if grouped else (factor == 1.0)
    decode_only = _decode(rows, context)  # no chunk beside them: no re-reads
    assert model.predict(decode_only) == plain.predict(decode_only)


def test_swapped_kv_is_priced_over_the_host_link_as_the_roofline_prices_it():
    """--preemption swap copies KV to and from host memory before the forward: both cost
    models charge the same bytes over the same link, and a step of copies alone costs them."""
    from sim.cost.roofline import AnalyticCostModel
    roofline = AnalyticCostModel.preset("llama-3-8b", "h100")
    model = _model("h100", "llama-3-8b")
    copies = BatchPlan(swap_tokens=4096)
    assert model.predict(copies) > 0
    assert model.predict(copies) == pytest.approx(roofline.predict(copies))
    step = _decode(8, 512)
    with_copies = BatchPlan(decode_seqs=8, decode_context=8 * 512, num_sampled=8,
                            swap_tokens=4096)
    assert model.predict(with_copies) == pytest.approx(
        model.predict(step) + model.predict(copies))


def test_measured_all_reduces_replace_the_scaled_curve():
    """A GPU file's measured all-reduces price its collectives; its other terms stay fitted."""
    shipped = known_gpu("rtx-pro-6000")
    measured = replace(shipped, allreduce=((2, 4e-5, 1.6e10),))
    terms, own = load_terms("rtx-pro-6000", shipped), load_terms("rtx-pro-6000", measured)
    assert own.allreduce == {2: (4e-5, 1.6e10)} and own.fitted == terms.fitted is True
    assert own.allreduce_s(1e6, 2) == pytest.approx(4e-5 + 1e6 / 1.6e10)
    assert own.allreduce_s(1e6, 2) > terms.allreduce_s(1e6, 2)
    assert own.gemm_eff_compute == terms.gemm_eff_compute


def _shapes(hf_id: str, **changes) -> LayerShapes:
    return replace(LayerShapes.from_model_spec(resolve_model(hf_id)), **changes)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("hf_id", ["Qwen/Qwen2-57B-A14B", "meta-llama/Llama-4-Scout-17B-16E"])
def test_a_shared_expert_costs_a_dense_mlp_of_its_width_beside_the_routed_ones(hf_id, tp):
    """A shared expert is a gated MLP every token runs through: an MoE layer costs its
    routed experts plus what a dense MLP that wide costs (Qwen2-MoE: and a one-output gate
    that scales it; Llama 4 adds it ungated)."""
    shapes = _shapes(hf_id)
    width = shapes.shared_expert_intermediate_size
    routed = _shapes(hf_id, shared_expert_intermediate_size=0)
    dense = _shapes(hf_id, num_experts=0, experts_per_token=0, moe_intermediate_size=0,
                    shared_expert_intermediate_size=0, intermediate_size=width)
    gpu, engine = known_gpu("h100"), load_engine("vllm")
    with_shared, without, mlp = (GpuCostModel(s, gpu, engine, tensor_parallel=tp)
                                 for s in (shapes, routed, dense))
    for tokens in (1, 16, 256, 2048):
        extra = with_shared.mlp_s(tokens) - without.mlp_s(tokens)
        if shapes.shared_expert_gate:
            assert mlp.mlp_s(tokens) < extra < 1.2 * mlp.mlp_s(tokens)
        else:
            assert extra == pytest.approx(mlp.mlp_s(tokens))


def test_a_one_row_decode_reads_every_active_weight_at_least_once():
    """A decode step of one row reads the weights its token uses, shared expert included:
    no faster than those bytes over the datasheet bandwidth."""
    for hf_id in ("Qwen/Qwen2-57B-A14B", "Qwen/Qwen1.5-MoE-A2.7B", "Qwen/Qwen3-30B-A3B",
                  "mistralai/Mixtral-8x7B-v0.1", "meta-llama/Llama-4-Scout-17B-16E"):
        spec = resolve_model(hf_id)
        gpu = known_gpu("h100")
        model = GpuCostModel(LayerShapes.from_model_spec(spec), gpu, load_engine("vllm"))
        # The embedding table is gathered (one row), not read whole.
        read = (spec.num_active_params - spec.vocab_size * spec.hidden_size) * 2
        assert model.predict(_decode(1, 16)) > read / gpu.mem_bandwidth_bytes_s, hf_id


def test_dense_layers_of_an_moe_model_cost_the_dense_mlp():
    """Layers an MoE config keeps dense (mlp_only_layers, first_k_dense_replace) price the
    dense MLP; the rest price experts: the model's MLP time is the sum of the two kinds."""
    gpu, engine = known_gpu("h100"), load_engine("vllm")
    layers, kept = 48, 6
    mixed = _shapes("Qwen/Qwen3-30B-A3B", num_dense_layers=kept)
    moe = _shapes("Qwen/Qwen3-30B-A3B")
    dense = _shapes("Qwen/Qwen3-30B-A3B", num_experts=0, experts_per_token=0,
                    moe_intermediate_size=0)
    priced = [GpuCostModel(s, gpu, engine, tensor_parallel=2) for s in (mixed, moe, dense)]
    for tokens in (1, 64, 2048):
        mixed_s, moe_s, dense_s = (layers * m.mlp_s(tokens) for m in priced)
        assert mixed_s == pytest.approx(((layers - kept) * moe_s + kept * dense_s) / layers)
    with pytest.raises(ValueError, match="num_dense_layers"):
        replace(moe, num_dense_layers=layers)


def test_tensor_parallel_gpus_under_expert_parallel_share_their_tokens():
    """vLLM's expert parallel spans tp x dp GPUs. The tp GPUs of one data-parallel rank hold
    the same tokens: each expert sees them once, and the MLP's all-reduce sums the experts'
    outputs. Data-parallel ranks bring their own tokens and exchange them around the layer."""
    gpu, engine = known_gpu("rtx-pro-6000"), load_engine("vllm")
    shapes = known_shapes("qwen3-30b-a3b")
    tp_ep = GpuCostModel(shapes, gpu, engine, tensor_parallel=2, expert_parallel=2)
    dp_ep = GpuCostModel(shapes, gpu, engine, tensor_parallel=1, expert_parallel=2)
    assert (tp_ep.data_parallel, dp_ep.data_parallel) == (1, 2)
    for n in (1, 64, 2048):
        assert tp_ep.mlp_s(n) == tp_ep.mlp_s(n, group_tokens=n)
        assert dp_ep.mlp_s(n) == dp_ep.mlp_s(n, group_tokens=2 * n)
        exchange = dp_ep.terms.allreduce_s(n * shapes.hidden_size * 2, 2)
        assert dp_ep.mlp_s(n, group_tokens=n) - tp_ep.mlp_s(n) == pytest.approx(exchange)
    with pytest.raises(ValueError, match="must divide"):
        GpuCostModel(shapes, gpu, engine, tensor_parallel=4, expert_parallel=2)



@pytest.mark.parametrize("tp", [1, 2])
def test_latent_attention_reads_one_latent_per_token_for_all_heads(tp):
    """DeepSeek-V2-Lite's decode reads, per context token and layer, one 512 + 64 latent
    for all 16 heads (whole on every GPU): a fraction of what per-head K and V of the same
    head_dim would read, and the same at any tp."""
    mla = _shapes("deepseek-ai/DeepSeek-V2-Lite")
    mha = replace(mla, kv_lora_rank=0, q_lora_rank=0, qk_rope_head_dim=0, v_head_dim=0)
    gpu, engine = known_gpu("h100"), load_engine("vllm")

    def slope(shapes: LayerShapes, tensor_parallel: int) -> float:
        model = GpuCostModel(shapes, gpu, engine, tensor_parallel=tensor_parallel)
        return model.predict(_decode(8, 4096)) - model.predict(_decode(8, 2048))

    heads = mla.num_heads // tp
    assert slope(mla, tp) / slope(mha, tp) == pytest.approx(
        (512 + 64) / (2 * heads * mla.head_dim), rel=0.01)
    assert slope(mla, tp) == pytest.approx(slope(mla, 1), rel=1e-9)
