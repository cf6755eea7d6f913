"""A checkpoint's own quantization_config, read as vLLM loads it: FP8 weights (per-tensor or
in blocks) and the KV cache dtype it turns on under --kv-cache-dtype auto."""

from __future__ import annotations

import json

import pytest

from sim.deployment import DeploymentOptions, build_deployment
from sim.specs.model_config import (
    MODELS_DIR,
    UnsupportedModelError,
    resolve_model,
    spec_from_config,
)


def _llama_8b(quantization_config: dict) -> dict:
    config = json.loads((MODELS_DIR / "meta-llama--Llama-3.1-8B.json").read_text())
    return config | {"quantization_config": quantization_config}


def test_block_fp8_checkpoint_sets_fp8_weights_and_keeps_a_16_bit_kv_cache() -> None:
    spec = resolve_model("Qwen/Qwen3-235B-A22B-FP8")
    assert spec.quantization == "fp8" and spec.kv_cache_dtype is None
    base = resolve_model("Qwen/Qwen3-235B-A22B")
    assert spec.num_params == base.num_params


def test_modelopt_fp8_checkpoint_turns_on_an_fp8_e4m3_kv_cache() -> None:
    spec = spec_from_config(_llama_8b({"quant_method": "modelopt", "quant_algo": "FP8",
                                       "kv_cache_quant_algo": "FP8"}), "m")
    assert (spec.quantization, spec.kv_cache_dtype) == ("fp8", "fp8_e4m3")
    nested = {"quant_method": "modelopt", "quantization": {"quant_algo": "FP8"}}
    assert spec_from_config(_llama_8b(nested), "m").kv_cache_dtype is None


def test_compressed_tensors_kv_cache_scheme_turns_on_an_fp8_kv_cache() -> None:
    config = {"quant_method": "compressed-tensors",
              "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}},
              "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False}}
    assert spec_from_config(_llama_8b(config), "m").kv_cache_dtype == "fp8"
    config["kv_cache_scheme"] = {"num_bits": 8, "type": "int"}
    with pytest.raises(UnsupportedModelError, match="kv_cache_scheme"):
        spec_from_config(_llama_8b(config), "m")


@pytest.mark.parametrize("config, words", [
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "modelopt"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "NVFP4"},
     "KV cache scheme"),
    ({"quant_method": "mxfp4"}, "mxfp4"),
])
def test_unknown_schemes_are_refused_by_name(config: dict, words: str) -> None:
    with pytest.raises(UnsupportedModelError, match=words):
        spec_from_config(_llama_8b(config), "m")


def test_the_checkpoints_kv_cache_applies_without_the_flag_and_the_flag_overrides_auto(
        tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_llama_8b({"quant_method": "modelopt", "quant_algo": "FP8",
                                          "kv_cache_quant_algo": "FP8"})))
    deployment = build_deployment(DeploymentOptions(model=str(path)))
    assert deployment.kv_cache_dtype == "fp8_e4m3" and deployment.quantization == "fp8"
    assert deployment.to_dict()["kv_cache_dtype"] == "fp8_e4m3"
    assert build_deployment(DeploymentOptions(model=str(path), kv_cache_dtype="fp8_e5m2")
                            ).kv_cache_dtype == "fp8_e5m2"
