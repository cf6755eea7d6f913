"""The runs benchmarks/peers/executor_peer.py times: HF generate variants and our engine.

Each returns greedy outputs by request id ("r0", "r1", ...) and the wall seconds it took.
"""

from __future__ import annotations

import time

import torch

from executor.backend import ModelBackend
from executor.model import Transformer
from sim.engine.core import Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace
from sim.specs.engine_limits import ENGINE_DEFAULTS

BLOCK_SIZE = ENGINE_DEFAULTS.block_size


def ours_continuous(model: Transformer, prompts: list[list[int]], outputs: list[int],
                    max_num_seqs: int = ENGINE_DEFAULTS.max_num_seqs
                    ) -> tuple[dict[str, list[int]], float, int]:
    """All requests at t=0 through the continuous policy; outputs, wall seconds, peak batch."""
    requests = [Request(f"r{i}", 0.0, len(p), n, prompt_token_ids=list(p))
                for i, (p, n) in enumerate(zip(prompts, outputs, strict=True))]
    blocks = sum(-(-(len(p) + n) // BLOCK_SIZE) for p, n in zip(prompts, outputs, strict=True))
    config = SchedulerConfig(policy="continuous", num_blocks=blocks + 1, block_size=BLOCK_SIZE,
                             max_num_seqs=max_num_seqs,
                             max_model_len=model.args.max_position_embeddings)
    scheduler = Scheduler(config)
    engine = Engine(scheduler, ModelBackend(model, scheduler.block_manager))
    start = time.perf_counter()
    result = run_trace(requests, engine)
    wall = time.perf_counter() - start
    peak = max(step.batch_size for step in result.steps)
    return {r.request_id: r.output_token_ids for r in requests}, wall, peak


def ours_one_at_a_time(model: Transformer, prompts: list[list[int]],
                       outputs: list[int]) -> tuple[dict[str, list[int]], float]:
    """Each request alone through our engine, one after another."""
    tokens: dict[str, list[int]] = {}
    wall = 0.0
    for i, (prompt, n) in enumerate(zip(prompts, outputs, strict=True)):
        out, seconds, _ = ours_continuous(model, [prompt], [n])
        tokens[f"r{i}"] = out["r0"]
        wall += seconds
    return tokens, wall


@torch.inference_mode()
def hf_sequential(model, prompts: list[list[int]],
                  outputs: list[int]) -> tuple[dict[str, list[int]], float]:
    """HF generate, one request at a time, greedy, EOS ignored."""
    _warm_up(model)
    tokens = {}
    start = time.perf_counter()
    for i, (prompt, n) in enumerate(zip(prompts, outputs, strict=True)):
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        tokens[f"r{i}"] = out[0, len(prompt):].tolist()
    return tokens, time.perf_counter() - start


@torch.inference_mode()
def hf_static(model, prompts: list[list[int]],
              outputs: list[int]) -> tuple[dict[str, list[int]], float]:
    """HF generate on the whole left-padded batch until the longest output is done."""
    _warm_up(model)
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt):] = torch.tensor(prompt)
        mask[i, width - len(prompt):] = 1
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max(outputs),
                         min_new_tokens=max(outputs), do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    wall = time.perf_counter() - start
    return {f"r{i}": out[i, width:width + n].tolist() for i, n in enumerate(outputs)}, wall


def hf_continuous(model, prompts: list[list[int]],
                  outputs: list[int]) -> tuple[dict[str, list[int]], float] | None:
    """HF's continuous batching manager (None if this transformers lacks it)."""
    if not hasattr(model, "continuous_batching_context_manager"):
        return None
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,
                              max_new_tokens=max(outputs))
    tokens = {}
    with torch.inference_mode(), model.continuous_batching_context_manager(
        generation_config=config, warmup=True
    ) as manager:
        start = time.perf_counter()
        for i, (prompt, n) in enumerate(zip(prompts, outputs, strict=True)):
            manager.add_request(prompt, request_id=f"r{i}", max_new_tokens=n)
        while len(tokens) < len(prompts):
            result = manager.get_result(timeout=5)
            if result is not None and result.is_finished():
                tokens[result.request_id] = list(result.generated_tokens)
        wall = time.perf_counter() - start
    return tokens, wall


def _warm_up(model) -> None:
    ids = torch.tensor([[5, 6, 7, 8]])
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                   do_sample=False, eos_token_id=None, pad_token_id=0)
