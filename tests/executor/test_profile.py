"""The calibration profile: its shapes' plans carry the totals the scheduler would give them."""

from __future__ import annotations

from types import SimpleNamespace

from executor.backend import ModelBackend
from executor.native import ROW_KNOTS
from executor.profile import (
    WARM_ROWS,
    GridProfile,
    ProfilePoint,
    _build_plan,
    measure,
    profile_grid,
)
from sim.engine.batch_plan import add_to_plan, add_verify
from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, StepResult
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from tests.executor.helpers import make_request


def test_static_points_plan_their_padding_like_the_static_scheduler():
    sched = Scheduler(SchedulerConfig(policy="static", num_blocks=64, max_model_len=256,
                                      max_num_seqs=4, enable_prefix_caching=False))
    lengths = {"a": (20, 1), "b": (30, 4), "c": (12, 4)}  # a finishes first: padding after
    for rid, (prompt, out) in lengths.items():
        sched.add(make_request(rid, prompt, max_new_tokens=out))
    for step in range(3):
        plan = sched.schedule(float(step))
        sched.update(plan, StepResult(0.01), float(step) + 0.01)
    plan = sched.schedule(3.0)
    assert [r.request_id for r in plan.padding] == ["a"]
    point = ProfilePoint.from_plan(plan)
    assert point.kind == "static" and len(point.padding) == 1
    backend = SimpleNamespace(block_manager=BlockManager(64, 16))  # all that planning uses
    built = _build_plan(point, backend, [[5] * (s + n) for s, n in point.shares]
                        + [[5] * length for length in point.padding])
    for total in ("decode_seqs", "num_sampled", "decode_context", "decode_context_max",
                  "prefill_tokens"):
        assert getattr(built, total) == getattr(plan, total), total


def test_every_grid_shape_runs_and_gives_its_blocks_back(tiny_model):
    bm = BlockManager(4096, 16)
    backend = ModelBackend(tiny_model, bm)
    points = profile_grid(256, 4096 * 16, quick=True)
    assert {p.kind for p in points} >= {"prefill", "decode", "static"}
    plans, times = measure(backend, points, repeats=2)
    assert times.shape == (2, len(points)) and (times > 0).all()
    assert bm.num_used_blocks == 0
    static = [plan for plan, p in zip(plans, points, strict=True) if p.kind == "static"]
    assert all(plan.padding and plan.num_sampled < plan.decode_seqs for plan in static)
    profile = GridProfile(backend, points[:3])
    profile.run_round(timed=False)
    profile.run_round()
    assert profile.times.shape == (1, 3) and len(profile.plans) == 3


def test_the_grid_prices_both_staircases_at_every_knot():
    # Decodes at every row knot, and static steps with every knot of live rows under the
    # knot past them: the fit needs both to tell the layers' cost from the lm_head's.
    points = profile_grid(2048, 10**6)
    decode_rows = {len(p.shares) for p in points if p.kind == "decode"}
    assert set(ROW_KNOTS) <= decode_rows
    live = {len(p.shares) for p in points if p.kind == "static"}
    assert {k for k in ROW_KNOTS if k < 48} <= live
    assert all(p.padding and all(n == 1 for _, n in p.shares)
               for p in points if p.kind == "static")


def test_small_shapes_are_timed_right_after_an_untimed_run_of_themselves(tiny_model):
    backend = ModelBackend(tiny_model, BlockManager(256, 16))
    executed = []
    execute = backend.execute
    backend.execute = lambda plan: executed.append(plan.prefill_tokens) or execute(plan)
    small, large = ProfilePoint("prefill", ((0, 8),)), ProfilePoint("prefill", ((0, 300),))
    assert small.rows == 8 <= WARM_ROWS < large.rows
    profile = GridProfile(backend, [small, large])
    profile.run_round(timed=False)
    assert executed == [8, 300]
    profile.run_round()
    assert executed == [8, 300, 8, 8, 300] and profile.times.shape == (1, 2)


def test_a_point_from_a_mixed_plan_rebuilds_its_totals():
    sched = Scheduler(SchedulerConfig(policy="continuous", num_blocks=64, max_model_len=256))
    sched.add(make_request("a", 20, max_new_tokens=4))
    plan = sched.schedule(0.0)
    sched.update(plan, StepResult(0.01), 0.01)
    sched.add(make_request("b", 30, max_new_tokens=4))
    plan = sched.schedule(0.02)  # a decodes while b's prompt runs
    point = ProfilePoint.from_plan(plan)
    assert point.kind == "mixed" and sorted(point.shares) == [(0, 30), (20, 1)]
    backend = SimpleNamespace(block_manager=BlockManager(64, 16))
    built = _build_plan(point, backend, [[5] * (s + n) for s, n in point.shares])
    for total in ("decode_seqs", "decode_context", "prefill_tokens", "prefill_attn",
                  "num_sampled"):
        assert getattr(built, total) == getattr(plan, total), total


def test_rounds_can_be_timed_a_shape_at_a_time(tiny_model):
    backend = ModelBackend(tiny_model, BlockManager(256, 16))
    points = [ProfilePoint("prefill", ((0, n),)) for n in (8, 16, 24)]
    profile = GridProfile(backend, points)
    profile.run_round(timed=False)
    for tag in ("a", "a", "b", "b"):
        profile.tag = tag  # what the machine was doing meanwhile
        profile.run_next()
    assert profile.times.shape == (1, 3)  # the round in progress is not kept yet
    profile.tag = None
    profile.finish_round()
    assert profile.times.shape == (2, 3) and (profile.times > 0).all()
    assert profile.round_tags == [["a", "a", "b"], ["b", None, None]]
    profile.finish_round()  # nothing in progress: nothing to do
    assert profile.times.shape == (2, 3) and backend.block_manager.num_used_blocks == 0
    assert [plan.prefill_tokens for plan in profile.plans] == [8, 16, 24]


def test_a_lent_backend_runs_the_shapes_its_free_blocks_hold_and_logs_none(tiny_model):
    home = ModelBackend(tiny_model, BlockManager(256, 16))
    log = []
    lent = ModelBackend(tiny_model, BlockManager(8, 16), step_log=log)
    lent.block_manager.allocate("a run's request", 5 * 16)  # 3 of its 8 blocks left free
    points = [ProfilePoint("prefill", ((0, 40),)),  # 3 blocks: fits
              ProfilePoint("prefill", ((0, 60),)),  # 4 blocks: runs at home
              ProfilePoint("decode", ((30, 1), (10, 1)))]  # 2 + 1 blocks: fits
    profile = GridProfile(home, points)
    profile.use(lent)
    profile.run_round()
    assert profile.borrowed == 2 and log == []  # the run's log holds the run's steps only
    assert lent.block_manager.num_free_blocks == 3 and home.block_manager.num_used_blocks == 0
    profile.use(None)
    profile.run_round()
    assert profile.borrowed == 2 and profile.times.shape == (2, 3)


def test_shapes_timed_on_a_runs_backend_change_none_of_its_outputs(tiny_model):
    from executor.calibration.interleave import Interleaved
    from executor.calibration.validation import measure_runs
    from workloads.sources import open_trace

    trace = open_trace("synthetic:n=12,rate=100,prompt=uniform(8,40),output=uniform(2,10)")
    configs = {"continuous": SchedulerConfig(num_blocks=64, max_model_len=256)}
    plain = measure_runs(trace, configs, tiny_model)["continuous"][0]
    points = [ProfilePoint("prefill", ((0, 24),)), ProfilePoint("decode", ((20, 1),))]
    profile = GridProfile(ModelBackend(tiny_model, BlockManager(64, 16)), points)
    mixed = Interleaved(profile, share=3.0)
    logs = {}
    mixed_run = measure_runs(trace, configs, tiny_model, 0, mixed.on_step, 1, mixed.start_run,
                             logs, mixed.use_backend)["continuous"][0]
    assert profile.borrowed > 0
    assert ([r.output_token_ids for r in mixed_run.requests]
            == [r.output_token_ids for r in plain.requests])
    assert len(logs["continuous"][0]) == len(mixed_run.steps)  # the run's steps only


def test_a_point_from_a_verifying_plan_rebuilds_its_totals():
    # A step of speculative decoding: a verifies 3 proposals, b 1, c decodes one token.
    plan = BatchPlan()
    for rid, context, k in (("a", 40, 3), ("b", 17, 1), ("c", 25, 0)):
        request = make_request(rid, context + 1, max_new_tokens=8)
        request.num_computed_tokens = context
        if k:
            add_verify(plan, request, k, (7,) * k)
        else:
            add_to_plan(plan, request, 1)
    point = ProfilePoint.from_plan(plan)
    assert point.kind == "verify" and point.proposals == (3, 1, 0)
    assert point.shares == ((40, 4), (17, 2), (25, 1))
    backend = SimpleNamespace(block_manager=BlockManager(64, 16))
    built = _build_plan(point, backend, [[5] * (s + n) for s, n in point.shares])
    assert built.num_spec_tokens == {"profile-0": 3, "profile-1": 1}
    assert {rid: len(ids) for rid, ids in built.spec_token_ids.items()} == built.num_spec_tokens
    for total in ("decode_seqs", "decode_context", "prefill_tokens", "prefill_seqs",
                  "prefill_attn", "prefill_attn_causal", "num_sampled"):
        assert getattr(built, total) == getattr(plan, total), total
    assert built.num_sampled == 4 + 2 + 1  # logits at every verified position


def test_verify_steps_are_profiled_only_for_speculation_and_run(tiny_model):
    assert not [p for p in profile_grid(256, 4096 * 16, quick=True) if p.kind == "verify"]
    points = [p for p in profile_grid(256, 4096 * 16, quick=True, speculative=True)
              if p.kind == "verify"]
    alone = [p for p in points if all(p.proposals)]
    with_decodes = [p for p in points if 0 in p.proposals]
    assert alone and with_decodes
    assert {k for p in points for k in p.proposals} == {0, 1, 4}
    bm = BlockManager(4096, 16)
    plans, times = measure(ModelBackend(tiny_model, bm), points, repeats=1)
    assert (times > 0).all() and bm.num_used_blocks == 0
    for plan, point in zip(plans, points, strict=True):
        assert sorted(plan.num_spec_tokens.values()) == sorted(k for k in point.proposals if k)
        assert plan.num_sampled == sum(k + 1 for k in point.proposals)


def test_speculative_grids_admit_whole_prompts_beside_verifying_rows():
    # A speculative run admits a prompt in a step where running rows verify: one ragged
    # forward the fit cannot price from prompt bursts and verify steps apart.
    def admitting(points):
        return [p for p in points if p.kind == "verify"
                and any(k == 0 and start == 0 and n > 1
                        for (start, n), k in zip(p.shares, p.proposals, strict=True))]
    assert not admitting(profile_grid(2048, 10**6))
    points = admitting(profile_grid(2048, 10**6, speculative=True))
    assert {sum(1 for k in p.proposals if k == 0) for p in points} == {1, 4}
    assert {k for p in points for k in p.proposals} == {0, 1, 4}
    backend = SimpleNamespace(block_manager=BlockManager(4096, 16))
    for point in points:
        plan = _build_plan(point, backend, [[5] * (s + n) for s, n in point.shares])
        prompts = [n for (_, n), k in zip(point.shares, point.proposals, strict=True) if not k]
        verifying = [k for k in point.proposals if k]
        assert sorted(plan.num_spec_tokens.values()) == sorted(verifying)
        assert plan.prefill_seqs == len(point.shares) and plan.decode_seqs == 0
        assert plan.prefill_tokens == sum(prompts) + sum(k + 1 for k in verifying)
        assert plan.num_sampled == len(prompts) + sum(k + 1 for k in verifying)
        assert ProfilePoint.from_plan(plan) == point


def test_the_grid_holds_no_step_of_more_sequences_than_the_scheduler_makes():
    full = profile_grid(2048, 10**6, speculative=True)
    assert max(p.seqs for p in full) > 256  # a chunk beside 256 decodes
    capped = profile_grid(2048, 10**6, speculative=True, max_num_seqs=64)
    assert max(p.seqs for p in capped) == 64
    assert capped == [p for p in full if p.seqs <= 64]
    assert {p.kind for p in capped} == {p.kind for p in full}
