"""Model construction and checkpoint loading: presets, seeds, round trips and bad inputs."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from executor.config import ModelArgs, UnsupportedModelError
from executor.model import Transformer
from executor.weights import (
    CheckpointError,
    load_hf_model,
    random_model,
    read_config,
    save_hf_checkpoint,
)
from sim.specs.model_specs import MODEL_SPECS
from tests.executor.helpers import TINY


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_model):
    path = tmp_path_factory.mktemp("tiny-hf")
    save_hf_checkpoint(tiny_model, path)
    return path


def copy_checkpoint(src, dst, config_edit=None, tensor_edit=None):
    """A copy of checkpoint src in dst, with its config dict and tensor dict edited in place."""
    dst.mkdir(exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    if config_edit:
        config_edit(config)
    if tensor_edit:
        tensor_edit(tensors)
    (dst / "config.json").write_text(json.dumps(config))
    save_file(tensors, dst / "model.safetensors")
    return dst


@pytest.mark.parametrize("name", list(MODEL_SPECS))
def test_preset_parameter_count_matches_the_spec(name):
    with torch.device("meta"):
        model = Transformer(ModelArgs.from_preset(name))
    assert sum(p.numel() for p in model.parameters()) == MODEL_SPECS[name].num_params


def test_random_init_is_deterministic_given_the_seed():
    a, b, c = random_model(TINY, seed=3), random_model(TINY, seed=3), random_model(TINY, seed=4)
    params = zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True)
    for (name, pa), pb, pc in params:
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name
    assert 0.015 < a.tok_embeddings.std().item() < 0.025  # HF's initializer_range 0.02


def test_saved_checkpoint_loads_back_identically(saved, tiny_model):
    loaded = load_hf_model(saved)
    assert loaded.args.vocab_size == TINY.vocab_size and loaded.args.n_kv_heads == TINY.n_kv_heads
    for (name, a), b in zip(tiny_model.named_parameters(), loaded.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_unsupported_architecture_is_named_with_the_supported_list(saved, tmp_path):
    def edit(config):
        config["architectures"] = ["GPT2LMHeadModel"]

    path = copy_checkpoint(saved, tmp_path / "gpt2", config_edit=edit)
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        load_hf_model(path)


def test_missing_tensor_is_named(saved, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    path = copy_checkpoint(saved, tmp_path / "missing", tensor_edit=lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=f"missing tensor.*'{name}'"):
        load_hf_model(path)


def test_wrong_shape_names_the_tensor_and_both_shapes(saved, tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"

    def edit(tensors):
        tensors[name] = torch.zeros(8, 64)

    path = copy_checkpoint(saved, tmp_path / "shape", tensor_edit=edit)
    shapes = r"has shape \(8, 64\), expected \(32, 64\)"
    with pytest.raises(CheckpointError, match=rf"'{name}' {shapes}"):
        load_hf_model(path)


def test_unexpected_tensor_is_named(saved, tmp_path):
    def edit(tensors):
        tensors["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)

    path = copy_checkpoint(saved, tmp_path / "extra", tensor_edit=edit)
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.0.self_attn.q_norm"):
        load_hf_model(path)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("hidden_act", "gelu", "hidden_act 'gelu'"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling type 'yarn'"),
    ("mlp_bias", True, "mlp_bias"),
])
def test_unsupported_options_are_named(saved, tmp_path, key, value, message):
    def edit(config):
        config[key] = value

    path = copy_checkpoint(saved, tmp_path / key, config_edit=edit)
    with pytest.raises(UnsupportedModelError, match=message):
        read_config(path)


def test_missing_files_are_reported(saved, tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_hf_model(tmp_path)
    (tmp_path / "config.json").write_text((saved / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_hf_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="invalid JSON"):
        load_hf_model(tmp_path)


def test_missing_required_config_key_is_named(saved, tmp_path):
    path = copy_checkpoint(saved, tmp_path / "nokey", config_edit=lambda c: c.pop("hidden_size"))
    with pytest.raises(ValueError, match="'hidden_size'"):
        read_config(path)


def test_model_args_validate_shapes():
    with pytest.raises(ValueError, match="n_heads not divisible by n_kv_heads"):
        ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=3, intermediate_size=8,
                  vocab_size=10, max_position_embeddings=16, head_dim=16)
    with pytest.raises(ValueError, match="unknown model preset"):
        ModelArgs.from_preset("gpt-5")
