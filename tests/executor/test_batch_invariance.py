"""The non-negotiable: every request's output, greedy or seeded sampling, is identical to
running it alone, under every policy, including chunked prefill and preemption + recompute."""

from __future__ import annotations

import numpy as np
import pytest

from executor.backend import ModelBackend
from sim.core import BatchPlan, Request, SamplingParams, StepResult
from sim.engine import Engine
from sim.scheduler import Scheduler, SchedulerConfig
from sim.simulation import run_trace
from tests.executor.helpers import make_request

STEP_S = 0.001  # a fixed clock: batch composition must not hang on measured times
MAX_MODEL_LEN = 128


class FixedClock:
    """Runs the real backend but reports a constant step time, so schedules are repeatable."""

    def __init__(self, backend: ModelBackend) -> None:
        self.backend = backend

    def execute(self, plan: BatchPlan) -> StepResult:
        return StepResult(STEP_S, self.backend.execute(plan).sampled_token_ids)

    def free(self, request: Request) -> None:
        self.backend.free(request)


def workload() -> list[Request]:
    """12 requests arriving over ~30 steps; odd ones sample (temperature, top-k, top-p)."""
    rng = np.random.default_rng(5)
    requests = []
    for i in range(12):
        sampling = SamplingParams() if i % 2 == 0 else SamplingParams(
            temperature=0.9, top_k=40, top_p=0.95, seed=100 + i)
        requests.append(make_request(
            f"r{i}", int(rng.integers(3, 70)), int(rng.integers(4, 25)), sampling,
            arrival_s=float(round(rng.uniform(0, 30)) * STEP_S),
        ))
    return sorted(requests, key=lambda r: r.arrival_s)


def run(model, requests: list[Request], **config) -> tuple[dict[str, list[int]], int]:
    scheduler = Scheduler(SchedulerConfig(block_size=16, max_model_len=MAX_MODEL_LEN, **config))
    engine = Engine(scheduler, FixedClock(ModelBackend(model, scheduler.block_manager)))
    result = run_trace(requests, engine)
    assert all(r.num_output_tokens == r.max_new_tokens for r in requests)
    return {r.request_id: r.output_token_ids for r in requests}, result.num_preemptions


@pytest.fixture(scope="module")
def outputs_alone(tiny_model) -> dict[str, list[int]]:
    outputs = {}
    for request in workload():
        request.arrival_s = 0.0
        outputs.update(run(tiny_model, [request], policy="continuous", num_blocks=16)[0])
    return outputs


POLICIES = {
    "static": dict(policy="static", num_blocks=256, max_num_seqs=4),
    "continuous": dict(policy="continuous", num_blocks=256, max_num_seqs=8),
    # 12 blocks of 16 tokens hold about two requests: evictions and recomputes are certain.
    "recompute": dict(policy="recompute", num_blocks=12, max_num_seqs=8),
    "chunked": dict(policy="chunked", num_blocks=12, max_num_seqs=8, token_budget=16),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_outputs_match_running_alone(tiny_model, outputs_alone, name):
    outputs, preemptions = run(tiny_model, workload(), **POLICIES[name])
    if name in ("recompute", "chunked"):
        assert preemptions > 0
    mismatched = [rid for rid in outputs_alone if outputs[rid] != outputs_alone[rid]]
    assert not mismatched, f"{name}: outputs differ from running alone for {mismatched}"
    assert any(len(set(tokens)) > 1 for tokens in outputs.values())
