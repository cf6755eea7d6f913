"""Scheduler invariants, step by step."""

from __future__ import annotations

import pytest

from sim.engine.core import FinishReason, Request, RequestStatus, StepResult
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import POLICIES, SchedulerConfig


def make(rid: str, prompt: int, out: int, at: float = 0.0) -> Request:
    return Request(rid, at, prompt, out)


def step(sched: Scheduler, now: float = 0.0):
    plan = sched.schedule(now)
    finished = sched.update(plan, StepResult(0.01), now + 0.01)
    return plan, finished


@pytest.mark.parametrize("policy", POLICIES)
def test_scheduler_admitted_request_gets_no_decode_token_in_same_step(policy):
    sched = Scheduler(SchedulerConfig(policy=policy, num_blocks=64, max_model_len=512))
    request = make("a", 40, 5)
    sched.add(request)
    plan, _ = step(sched)
    assert plan.num_scheduled_tokens == {"a": 40}
    assert plan.admitted == ["a"]
    assert request.num_output_tokens == 1
    assert request.num_computed_tokens == 40


@pytest.mark.parametrize("policy", ["continuous", "recompute", "chunked"])
def test_scheduler_running_requests_advance_exactly_one_token_per_step(policy):
    sched = Scheduler(SchedulerConfig(policy=policy, num_blocks=256, max_model_len=512))
    first = make("a", 30, 50)
    sched.add(first)
    step(sched)
    for i in range(5):
        late = make(f"late{i}", 20 + i, 50)
        sched.add(late)
        before = first.num_output_tokens
        plan, _ = step(sched)
        assert first.num_output_tokens == before + 1
        assert plan.num_scheduled_tokens[late.request_id] == late.prompt_len
        assert late.num_output_tokens == 1
        assert plan.num_scheduled_tokens["a"] == 1


def test_scheduler_finishes_at_max_new_tokens_and_frees_blocks_at_once():
    sched = Scheduler(SchedulerConfig(policy="continuous", num_blocks=16, max_model_len=256))
    request = make("a", 17, 3)
    sched.add(request)
    finished = []
    for _ in range(3):
        _, finished = step(sched)
    assert finished == [request]
    assert request.finish_reason is FinishReason.LENGTH
    assert request.num_output_tokens == 3
    assert sched.block_manager.num_free_blocks == 16
    assert not sched.has_unfinished


def test_scheduler_stops_on_stop_ids_always_and_on_eos_unless_ignore_eos():
    from sim.engine.core import SamplingParams

    sched = Scheduler(SchedulerConfig(policy="continuous", num_blocks=16, max_model_len=256))
    eos = Request("e", 0.0, 4, 10, [1, 2, 3, 4], SamplingParams(eos_token_id=7,
                                                                 ignore_eos=False))
    keep = Request("k", 0.0, 4, 10, [1, 2, 3, 4], SamplingParams(eos_token_id=7))
    stop = Request("s", 0.0, 4, 10, [1, 2, 3, 4], SamplingParams(stop_token_ids=(7,)))
    for request in (eos, keep, stop):
        sched.add(request)
    plan = sched.schedule(0.0)
    finished = sched.update(plan, StepResult(0.01, {"e": 7, "k": 7, "s": 7}), 0.01)
    assert finished == [eos, stop]
    assert eos.finish_reason is stop.finish_reason is FinishReason.STOP
    assert keep.status is RequestStatus.RUNNING


def test_static_abort_of_the_last_live_row_ends_the_batch_and_frees_every_block():
    sched = Scheduler(SchedulerConfig(policy="static", num_blocks=64, max_model_len=256))
    short, long = make("short", 10, 2), make("long", 12, 50)
    sched.add(short)
    sched.add(long)
    step(sched)
    step(sched)  # short finished: now padding
    assert sched.abort("long", now=1.0) is long
    assert long.finish_reason is FinishReason.ABORTED and long.finish_s == 1.0
    plan, finished = step(sched, now=1.0)  # one padding-only step closes the batch
    assert len(plan.padding) == 2 and not plan.requests
    assert set(finished) == {short, long} and long.finish_s == 1.0
    assert sched.block_manager.num_used_blocks == 0 and not sched.has_unfinished


def test_static_batch_keeps_finished_rows_as_padding_until_the_batch_ends():
    sched = Scheduler(SchedulerConfig(policy="static", num_blocks=64, max_model_len=256))
    short, long = make("short", 10, 2), make("long", 12, 5)
    sched.add(short)
    sched.add(long)
    step(sched)  # prefill both, one token each
    step(sched)  # short reaches 2 tokens
    sched.add(make("late", 5, 2))
    paddings = []
    finished = []
    while not finished:
        plan, finished = step(sched)
        assert "late" not in plan.num_scheduled_tokens  # no joining mid-batch
        paddings.append(len(plan.padding))
    assert paddings == [1, 1, 1]
    assert {r.request_id for r in finished} == {"short", "long"}
    assert short.finish_s == long.finish_s  # returned when the batch ends
    assert sched.block_manager.num_used_blocks == 0
    plan, _ = step(sched)
    assert plan.admitted == ["late"]


def test_chunked_prefill_mixes_decodes_first_within_budget():
    cfg = SchedulerConfig(policy="chunked", num_blocks=256, max_model_len=1024,
                          token_budget=64, max_num_seqs=8)
    sched = Scheduler(cfg)
    sched.add(make("a", 10, 20))
    step(sched)
    sched.add(make("big", 150, 4))
    plan, _ = step(sched)
    assert list(plan.num_scheduled_tokens.items()) == [("a", 1), ("big", 63)]
    assert (plan.decode_seqs, plan.prefill_seqs, plan.num_sampled) == (1, 1, 1)
    plan, _ = step(sched)
    assert list(plan.num_scheduled_tokens.items()) == [("a", 1), ("big", 63)]
    assert (plan.prefill_chunk_max, plan.prefill_context_max) == (63, 126)
    plan, _ = step(sched)
    assert plan.num_scheduled_tokens == {"a": 1, "big": 24}
    assert plan.num_sampled == 2 and plan.prefill_attn == 24 * 150
    assert plan.prefill_attn_causal == 24 * 150 - 24 * 23 // 2  # positions 126..149
    assert sched.running[1].num_output_tokens == 1


def test_recompute_evicts_newest_to_front_of_queue_and_it_resumes():
    cfg = SchedulerConfig(policy="recompute", num_blocks=4, block_size=4, max_model_len=16,
                          max_num_seqs=4)
    sched = Scheduler(cfg)
    old, new = make("old", 7, 6), make("new", 7, 6)
    sched.add(old)
    sched.add(new)
    step(sched)  # both prefill 7 tokens: 2 blocks each, pool full
    plan, _ = step(sched)  # both need an 8th slot... 7+1 = 8 fits; next step needs block 3
    plan, _ = step(sched)
    assert plan.preempted == ["new"]
    assert new.status is RequestStatus.PREEMPTED and new.num_computed_tokens == 0
    assert sched.waiting[0] is new
    tokens_before = new.num_output_tokens
    while sched.has_unfinished:
        step(sched)
    assert old.num_output_tokens == 6 and new.num_output_tokens == 6
    assert new.num_preemptions >= 1 and tokens_before >= 1
    assert sched.block_manager.num_free_blocks == 4


@pytest.mark.parametrize("policy", POLICIES)
def test_oversized_request_is_rejected_and_others_still_finish(policy):
    cfg = SchedulerConfig(policy=policy, num_blocks=8, block_size=16, max_model_len=4096)
    sched = Scheduler(cfg)
    huge = make("huge", 200, 10)  # 210 tokens need 14 blocks > 8
    too_long = make("too_long", 4000, 200)  # above max_model_len
    ok = make("ok", 20, 5)
    assert sched.add(huge) is False
    assert sched.add(too_long) is False
    assert sched.add(ok) is True
    assert huge.finish_reason is FinishReason.REJECTED and "8" in huge.finish_detail
    assert "max_model_len" in too_long.finish_detail
    while sched.has_unfinished:
        step(sched)
    assert ok.finish_reason is FinishReason.LENGTH


def test_abort_frees_blocks_at_once_and_leaves_others_running():
    sched = Scheduler(SchedulerConfig(policy="recompute", num_blocks=32, max_model_len=256))
    a, b = make("a", 40, 50), make("b", 40, 50)
    sched.add(a)
    sched.add(b)
    step(sched)
    used = sched.block_manager.num_used_blocks
    assert sched.abort("a", now=1.0) is a
    assert a.finish_reason is FinishReason.ABORTED
    assert sched.block_manager.num_used_blocks == used - 3
    assert sched.abort("a") is None
    plan, _ = step(sched)
    assert plan.num_scheduled_tokens == {"b": 1}


def test_duplicate_live_request_id_is_refused():
    sched = Scheduler(SchedulerConfig())
    sched.add(make("a", 4, 4))
    with pytest.raises(ValueError, match="already in flight"):
        sched.add(make("a", 4, 4))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "fifo"}, "unknown policy"),
        ({"num_blocks": 0}, "num_blocks"),
        ({"token_budget": -1}, "token_budget"),
        ({"policy": "continuous", "token_budget": 512, "max_model_len": 1024}, "chunked"),
        ({"policy": "chunked", "token_budget": 8, "max_num_seqs": 16}, "max_num_seqs"),
    ],
)
def test_bad_scheduler_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**kwargs)
