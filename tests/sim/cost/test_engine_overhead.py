"""vLLM's own time as named terms: full vs piecewise CUDA graphs, async scheduling, the front
end's per-request time, the terms' file and its bounds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sim.cost.engine_overhead import VLLM_PATH, VLLM_TERMS, EngineOverhead, load_engine, load_vllm
from sim.cost.gpu_cost import GpuCostModel
from sim.cost.gpu_shapes import known_gpu, known_shapes
from sim.engine.core import BatchPlan

BARE = EngineOverhead("bare", 0.0, 0.0, 0.0, "", overlapped=True, graph_max_rows=512)
LAYERS = known_shapes("llama-3-8b").num_layers


def _model(engine: EngineOverhead) -> GpuCostModel:
    return GpuCostModel(known_shapes("llama-3-8b"), known_gpu("h100"), engine)


def _decode(rows: int, context: int = 256) -> BatchPlan:
    return BatchPlan(decode_seqs=rows, decode_context=rows * context, num_sampled=rows)


def _mixed(tokens: int = 64, rows: int = 4) -> BatchPlan:
    return BatchPlan(prefill_tokens=tokens, prefill_seqs=1,
                     prefill_attn_causal=tokens * (tokens + 1) // 2, decode_seqs=rows,
                     decode_context=rows * 256, num_sampled=rows + 1)


def test_a_decode_batch_under_the_graph_size_runs_no_piecewise_host_time():
    slow_launch = replace(BARE, piecewise_layer_s=1e-3)  # far above any layer's GPU time
    bare, piecewise = _model(BARE), _model(slow_launch)
    assert piecewise.predict(_decode(8)) == bare.predict(_decode(8))
    assert piecewise.predict(_decode(512)) == bare.predict(_decode(512))


def test_a_mixed_batch_or_a_decode_above_the_graph_size_takes_the_piecewise_host_time():
    piecewise = _model(replace(BARE, piecewise_layer_s=1e-3))
    assert piecewise.predict(_mixed()) >= LAYERS * 1e-3
    assert piecewise.predict(_decode(513)) >= LAYERS * 1e-3
    # Host launches run beside the GPU: a layer slower than them keeps its own time.
    cheap = _model(replace(BARE, piecewise_layer_s=1e-9))
    assert cheap.predict(_mixed()) == _model(BARE).predict(_mixed())


def test_decode_runs_above_the_graph_size_match_predict_bit_for_bit():
    model = _model(replace(BARE, piecewise_layer_s=2e-4, step_s=1e-3))
    steps = model.decode_steps_s(rows=600, context=600 * 100, num_steps=4)
    assert steps == [model.predict(_decode(600, 100 + i)) for i in range(4)]


def test_async_scheduling_hides_a_host_step_shorter_than_the_gpu_step():
    bare = _model(BARE)
    gpu_s = bare.predict(_decode(8))
    short = _model(replace(BARE, step_s=gpu_s / 2))
    assert short.predict(_decode(8)) == gpu_s
    long = _model(replace(BARE, step_s=2 * gpu_s))
    assert long.predict(_decode(8)) == 2 * gpu_s
    serial = _model(replace(BARE, step_s=gpu_s / 2, overlapped=False))
    assert serial.predict(_decode(8)) == pytest.approx(1.5 * gpu_s)


def test_each_output_token_costs_the_host_its_per_row_time():
    per_row = _model(replace(BARE, per_row_s=1e-4, overlapped=False))
    extra = per_row.predict(_decode(100)) - _model(replace(BARE, overlapped=False)).predict(
        _decode(100))
    assert extra == pytest.approx(100 * 1e-4)


def test_versions_before_async_scheduling_add_the_host_step_to_the_gpu_step():
    assert load_vllm("0.19.1").overlapped and load_vllm().overlapped
    assert not load_vllm("0.10.2").overlapped
    assert load_engine("vllm", vllm_version="0.8.5").overlapped is False
    with pytest.raises(ValueError, match="'latest'"):
        load_vllm("latest")


def test_the_request_time_is_the_models_request_overhead():
    model = _model(replace(BARE, request_s=7e-3))
    assert model.request_overhead_s == 7e-3
    model.use_engine(BARE)
    assert model.request_overhead_s == 0.0


def test_a_model_keeps_the_kernel_dispatch_it_was_built_with():
    model = _model(BARE)
    with pytest.raises(ValueError, match="per_kernel_s"):
        model.use_engine(replace(BARE, per_kernel_s=1e-5))


@pytest.mark.parametrize("term", ["step_s", "per_row_s", "request_s", "piecewise_layer_s"])
def test_a_negative_term_is_rejected_with_its_name(term):
    with pytest.raises(ValueError, match=term):
        replace(BARE, **{term: -1e-3})


def test_the_shipped_terms_lie_in_their_physical_bounds():
    data = json.loads(VLLM_PATH.read_text())
    for term in VLLM_TERMS:
        lo, hi = data[term]["bounds"]
        assert lo <= data[term]["value"] <= hi, term
        assert data[term]["_what"] and data[term]["source"], term
    assert data["request_s"]["bounds"][1] <= 0.02 and data["step_s"]["bounds"][1] <= 0.005
