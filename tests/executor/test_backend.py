"""ModelBackend and its helpers: measured steps, who samples, padding rows, device/dtype."""

from __future__ import annotations

import sys

import pytest
import torch

from executor.backend import ModelBackend, load_model, resolve_device, resolve_dtype
from executor.loading import configure_cpu_threads, keep_large_allocations
from executor.weights import save_hf_checkpoint
from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, Request
from tests.executor.helpers import make_request


def plan_of(chunks: list[tuple[Request, int]], padding: list[Request] = ()) -> BatchPlan:
    return BatchPlan(num_scheduled_tokens={r.request_id: n for r, n in chunks},
                     requests=[r for r, _ in chunks], padding=list(padding))


def advance(plan: BatchPlan, result) -> None:
    """What the scheduler's update does to the requests (enough for these tests)."""
    for request in plan.requests:
        request.num_computed_tokens += plan.num_scheduled_tokens[request.request_id]
        if request.request_id in result.sampled_token_ids:
            request.output_token_ids.append(result.sampled_token_ids[request.request_id])
            request.token_times_s.append(0.0)


def test_step_measures_time_and_samples_only_finished_sequences(tiny_model):
    bm = BlockManager(32, 16)
    backend = ModelBackend(tiny_model, bm)
    a, b = make_request("a", 20), make_request("b", 5)
    bm.allocate("a", 21)
    bm.allocate("b", 6)
    plan = plan_of([(a, 12), (b, 5)])  # a stops mid-prompt, b completes its prompt
    result = backend.execute(plan)
    assert result.duration_s > 0
    assert set(result.sampled_token_ids) == {"b"}
    advance(plan, result)
    plan = plan_of([(b, 1), (a, 8)])
    result = backend.execute(plan)
    assert set(result.sampled_token_ids) == {"a", "b"}
    assert all(0 <= t < tiny_model.args.vocab_size for t in result.sampled_token_ids.values())


def test_padding_rows_produce_nothing_and_leave_outputs_unchanged(tiny_model):
    bm = BlockManager(32, 16)
    backend = ModelBackend(tiny_model, bm)
    a, done = make_request("a", 9), make_request("done", 7)
    for request in (a, done):
        bm.allocate(request.request_id, request.prompt_len + 4)
    plan = plan_of([(a, 9), (done, 7)])
    result = backend.execute(plan)
    advance(plan, result)
    plan = plan_of([(a, 1)])
    alone = backend.execute(plan).sampled_token_ids
    # Same step again with `done` as a padding row recomputing its last position.
    padded = backend.execute(plan_of([(a, 1)], padding=[done])).sampled_token_ids
    assert padded == alone and "done" not in padded


def test_empty_plan_is_a_no_op(tiny_model):
    backend = ModelBackend(tiny_model, BlockManager(4, 16))
    assert backend.execute(BatchPlan()).sampled_token_ids == {}


def test_load_model_from_preset_or_directory(tmp_path, tiny_model):
    assert load_model("tiny").args.dim == 64
    save_hf_checkpoint(tiny_model, tmp_path)
    loaded = load_model(str(tmp_path))
    assert torch.equal(loaded.output.weight, tiny_model.output.weight)
    with pytest.raises(ValueError, match="unknown model preset 'nope'"):
        load_model("nope")


def test_device_and_dtype_resolution():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device(None).type in ("cpu", "cuda")
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        resolve_dtype("fp8", torch.device("cpu"))
    with pytest.raises(ValueError, match="not supported"):
        resolve_device("mps")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_configure_cpu_threads_sets_and_validates():
    before = torch.get_num_threads()
    try:
        assert configure_cpu_threads(1) == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="num_threads"):
        configure_cpu_threads(0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_large_allocations_stay_in_the_heap_unless_the_user_chose(monkeypatch):
    assert keep_large_allocations()  # glibc accepted both settings
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert not keep_large_allocations()  # the user's own threshold wins


def test_bfloat16_on_cpu_runs(tiny_model):
    from executor.weights import random_model

    model = random_model(tiny_model.args, seed=0, dtype=torch.bfloat16)
    bm = BlockManager(8, 16)
    backend = ModelBackend(model, bm)
    request = make_request("a", 10)
    bm.allocate("a", 11)
    assert backend.kv.data.dtype == torch.bfloat16
    assert set(backend.execute(plan_of([(request, 10)])).sampled_token_ids) == {"a"}


def test_a_measured_run_logs_every_step_it_timed(tiny_model):
    from executor.replay import measured_run
    from sim.engine.scheduler_config import SchedulerConfig

    # All arrive at once: the first static batch holds four of different lengths (so rows
    # finish early and pad) whatever a step measures; arrivals 1 ms apart would batch
    # together or not depending on how fast the machine runs the first prefill.
    requests = [Request(f"r{i}", 0.0, 8 + 3 * i, 3 + i) for i in range(6)]
    log: list = []
    run = measured_run(requests, SchedulerConfig("static", num_blocks=64, max_num_seqs=4),
                       tiny_model, step_log=log)
    assert len(log) == len(run.steps) > 0
    assert [seconds for _, seconds in log] == [step.duration_s for step in run.steps]
    assert [plan.prefill_tokens for plan, _ in log] == [step.prefill_tokens for step in run.steps]
    assert any(plan.padding for plan, _ in log)  # static batches' finished rows
