"""CUDA paths (bf16/fp16 and float32); skipped without a GPU. Batch invariance is only
guaranteed on CPU (cuBLAS picks kernels by shape), so these check correctness, not bits."""

from __future__ import annotations

import pytest
import torch

from executor.backend import ModelBackend
from executor.weights import random_model
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace
from tests.executor.helpers import TINY, Driver, make_request

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_engine_runs_every_request(dtype):
    model = random_model(TINY, seed=0, device="cuda", dtype=dtype)
    scheduler = Scheduler(SchedulerConfig(policy="chunked", num_blocks=16, token_budget=32,
                                          max_num_seqs=8, max_model_len=128))
    backend = ModelBackend(model, scheduler.block_manager)
    requests = [make_request(f"r{i}", 5 + 9 * i, 12) for i in range(6)]
    run_trace(requests, Engine(scheduler, backend))
    assert all(len(r.output_token_ids) == 12 for r in requests)
    assert backend.kv.data.dtype == dtype and backend.kv.data.is_cuda


def test_float32_cuda_logits_match_cpu(tiny_model):
    cuda_model = random_model(TINY, seed=0, device="cuda")
    request = make_request("a", 70)
    expected = Driver(tiny_model).step([(make_request("a", 70), 70)])
    driver = Driver(cuda_model)
    got = torch.cat([driver.step([(request, 40)]), driver.step([(request, 30)])])
    torch.testing.assert_close(got.cpu(), expected, atol=1e-3, rtol=1e-3)
