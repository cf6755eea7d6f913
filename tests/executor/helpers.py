"""Helpers for executor tests: requests with synthetic prompts and a direct step driver."""

from __future__ import annotations

from dataclasses import replace

import torch

from executor.batch import Segment, build_step_inputs
from executor.config import ModelArgs
from executor.kv_cache import KVCache
from executor.model import Transformer
from executor.prompts import synth_prompt_tokens
from executor.replay import measured_run
from sim.engine.block_manager import BlockManager
from sim.engine.core import Backend, BatchPlan, Request, SamplingParams, StepResult
from sim.engine.scheduler_config import SchedulerConfig
from sim.replay.workload import requests_from_trace
from workloads import TraceTransforms, open_trace

TINY = ModelArgs.from_preset("tiny")


def make_request(request_id: str, prompt_len: int, max_new_tokens: int = 8,
                 sampling: SamplingParams | None = None, vocab_size: int = TINY.vocab_size,
                 arrival_s: float = 0.0) -> Request:
    """A request with deterministic synthetic prompt tokens."""
    tokens = synth_prompt_tokens(request_id, prompt_len, vocab_size)
    return Request(request_id, arrival_s, prompt_len, max_new_tokens, prompt_token_ids=tokens,
                   sampling=sampling or SamplingParams())


class Driver:
    """Runs steps of one model over its own BlockManager and KV cache, no scheduler."""

    def __init__(self, model: Transformer, num_blocks: int = 64, block_size: int = 16) -> None:
        self.model = model
        self.device = model.tok_embeddings.device
        self.block_manager = BlockManager(num_blocks, block_size)
        self.kv = KVCache(model.args, num_blocks, block_size, self.device,
                          model.tok_embeddings.dtype)

    def step(self, chunks: list[tuple[Request, int]], all_logits: bool = True) -> torch.Tensor:
        """Compute n tokens of each (request, n) from its num_computed_tokens; returns logits."""
        segments = []
        for request, n in chunks:
            start = request.num_computed_tokens
            self.block_manager.allocate(request.request_id, start + n)
            segments.append(Segment(request, start, n, start + n == request.num_tokens))
        with torch.inference_mode():
            inputs = build_step_inputs(segments, self.block_manager, self.model.args,
                                       self.device, all_logits=all_logits,
                                       paged=self.model.native)
            logits = self.model(inputs, self.kv)
        for request, n in chunks:
            request.num_computed_tokens += n
        return logits


class FixedClock:
    """Runs the real backend but reports a constant step time, so schedules are repeatable
    (and do not hang on how fast the machine ran a step)."""

    def __init__(self, backend: Backend, step_s: float) -> None:
        self.backend = backend
        self.step_s = step_s

    def execute(self, plan: BatchPlan) -> StepResult:
        result = self.backend.execute(plan)
        return StepResult(self.step_s, result.sampled_token_ids, result.spec_token_ids)

    def free(self, request: Request) -> None:
        self.backend.free(request)


def bundled_greedy_runs(model: Transformer, speculatives: tuple) -> tuple[list[dict], list]:
    """The first 16 azure-conv requests (prompts <= 64, outputs <= 32 tokens) measured under
    chunked prefill once per speculative config (None: off): each run's output token ids by
    request, and each run's scheduler."""
    trace = TraceTransforms(max_requests=16, max_prompt_len=64, max_output_len=32).apply(
        open_trace("azure-conv"))
    config = SchedulerConfig(policy="chunked", num_blocks=64, block_size=16, max_num_seqs=8,
                             token_budget=64, max_model_len=128)
    outputs, schedulers = [], []
    for speculative in speculatives:
        requests = requests_from_trace(trace)
        measured_run(requests, replace(config, speculative=speculative), model,
                     on_scheduler=schedulers.append)
        outputs.append({r.request_id: r.output_token_ids for r in requests})
    return outputs, schedulers
