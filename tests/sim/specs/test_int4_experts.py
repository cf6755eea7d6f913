"""Kimi-K2.5: a multimodal config whose text model is DeepSeek-V3 with its routed experts in
4-bit integers (compressed-tensors W4A16), the quantization_config beside the text fields."""

from __future__ import annotations

import copy
import json

import pytest

from sim.cost.gpu_cost import gpu_cost_backend
from sim.deployment import DeploymentOptions, build_deployment
from sim.specs.hardware import hardware_spec
from sim.specs.model_config import (
    MODELS_DIR,
    UnsupportedModelError,
    resolve_model,
    spec_from_config,
)

KIMI = "moonshotai/Kimi-K2.5"


def _config() -> dict:
    return json.loads((MODELS_DIR / (KIMI.replace("/", "--") + ".json")).read_text())


def _with_quantization(change) -> dict:
    config = copy.deepcopy(_config())
    change(config["text_config"]["quantization_config"])
    return config


def test_kimi_reads_its_text_model_and_int4_routed_experts():
    spec = resolve_model(KIMI)
    assert (spec.num_layers, spec.num_experts, spec.num_experts_per_tok) == (61, 384, 8)
    assert spec.kv_lora_rank == 512 and spec.num_dense_layers == 1
    assert spec.expert_quantization == "int4" and spec.quantization is None


def test_int4_experts_take_4_5_bits_a_weight_and_the_rest_16():
    spec = resolve_model(KIMI)
    experts = spec.expert_params_total
    assert spec.weight_bytes(2, 2) == int((spec.num_params - experts) * 2 + experts * 4.5 / 8)
    # The published int4 checkpoint: about 594 GB (the vision tower aside).
    assert spec.weight_bytes(2, 2) / 1e9 == pytest.approx(594, rel=0.01)
    fitted = gpu_cost_backend(spec, hardware_spec("h200"), tensor_parallel=8)
    assert fitted._expert_bytes == 4.5 / 8 and fitted._expert_peak is None  # 16-bit GEMMs


def test_kimi_deploys_on_eight_h200s_and_says_how_its_experts_are_priced():
    deployment = build_deployment(DeploymentOptions(model=KIMI, hardware="h200",
                                                    tensor_parallel=8))
    assert deployment.kv_pool.num_blocks > 0
    assert "int4 experts weight-only: 4.5-bit weights read" in deployment.description


def test_a_text_models_unpriced_quantization_is_refused_not_read_as_16_bit():
    config = copy.deepcopy(_config())
    config["text_config"]["quantization_config"] = {"quant_method": "awq", "bits": 4}
    with pytest.raises(UnsupportedModelError, match="quant_method 'awq'"):
        spec_from_config(config, KIMI)


@pytest.mark.parametrize(("change", "reason"), [
    (lambda q: q["ignore"].remove("re:.*shared_experts.*"), "int4 on shared experts"),
    (lambda q: q["ignore"].append("re:.*experts.*"), "int4 on no experts"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(group_size=128),
     "weight-only in groups of 32"),
    (lambda q: q["config_groups"]["group_0"].update(input_activations={"num_bits": 8}),
     "weight-only in groups of 32"),
])
def test_int4_beyond_weight_only_routed_experts_is_refused_by_name(change, reason):
    with pytest.raises(UnsupportedModelError, match=reason):
        spec_from_config(_with_quantization(change), KIMI)
