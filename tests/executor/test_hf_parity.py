"""Parity with Hugging Face transformers: tiny random Llama and Qwen2 checkpoints, saved with
save_pretrained and loaded by executor.weights, give HF's logits and HF's greedy tokens."""

from __future__ import annotations

import pytest
import torch

from executor.backend import ModelBackend
from executor.weights import load_hf_model
from sim.engine.core import Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace

transformers = pytest.importorskip("transformers")

LOGITS_ATOL = 1e-4  # float32; observed differences are ~2e-7
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=300, max_position_embeddings=256)
VARIANTS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": False}),
    "llama-sharded": ("LlamaConfig", "LlamaForCausalLM", {"rope_theta": 500000.0}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": False}),
    "qwen2-tied": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 16}),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def checkpoint(request, tmp_path_factory):
    """(HF model, directory it was saved to) for one variant."""
    config_name, model_name, extra = VARIANTS[request.param]
    config = getattr(transformers, config_name)(**SMALL, **extra)
    torch.manual_seed(0)
    hf = getattr(transformers, model_name)(config).eval()
    path = tmp_path_factory.mktemp(request.param)
    shard = "40KB" if request.param.endswith("sharded") else "1GB"
    hf.save_pretrained(path, max_shard_size=shard)
    return hf, path


def prompt(n: int, seed: int = 1) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, SMALL["vocab_size"], (n,), generator=generator).tolist()


def test_sharded_checkpoint_has_an_index(checkpoint):
    hf, path = checkpoint
    sharded = (path / "model.safetensors.index.json").is_file()
    assert sharded == path.name.startswith("llama-sharded")


def test_logits_match_hf(checkpoint, kernel_path):
    from tests.executor.helpers import Driver

    hf, path = checkpoint
    with kernel_path():
        model = load_hf_model(path)
    tokens = prompt(45)
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0]
    request = Request("p", 0.0, len(tokens), 1, prompt_token_ids=tokens)
    ours = Driver(model).step([(request, len(tokens))])
    torch.testing.assert_close(ours, expected, atol=LOGITS_ATOL, rtol=0)


def test_greedy_tokens_match_hf_generate(checkpoint, kernel_path):
    hf, path = checkpoint
    with kernel_path():
        model = load_hf_model(path)
    prompts = [prompt(n, seed) for seed, n in enumerate((7, 30, 61))]
    new_tokens = 20
    requests = [Request(f"r{i}", 0.0, len(p), new_tokens, prompt_token_ids=p)
                for i, p in enumerate(prompts)]
    scheduler = Scheduler(SchedulerConfig(num_blocks=64, block_size=16, max_model_len=256))
    run_trace(requests, Engine(scheduler, ModelBackend(model, scheduler.block_manager)))
    for tokens, request in zip(prompts, requests, strict=True):
        ids = torch.tensor([tokens])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
        assert request.output_token_ids == out[0, len(tokens):].tolist()
