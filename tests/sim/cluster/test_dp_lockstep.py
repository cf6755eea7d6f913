"""Data-parallel ranks joined by expert parallelism step together."""

from __future__ import annotations

import pytest

from sim.cluster.closed_loop import ClosedLoop, run_closed_trace
from sim.cluster.dp_lockstep import group_step_s, run_lockstep
from sim.cost.engine_overhead import EngineOverhead, load_engine
from sim.cost.gpu_cost import GpuCostModel
from sim.cost.gpu_shapes import known_gpu, known_shapes
from sim.engine.core import BatchPlan, Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from workloads.sessions import chains_of


def _moe(ep: int = 2) -> GpuCostModel:
    return GpuCostModel(known_shapes("qwen3-30b-a3b"), known_gpu("rtx-pro-6000"),
                        load_engine("vllm"), expert_parallel=ep)


def test_a_lockstep_step_lasts_as_long_as_the_slowest_rank():
    model = _moe()
    busy = BatchPlan(prefill_tokens=1024, prefill_seqs=1, prefill_attn_causal=1024 * 1025 // 2,
                     num_sampled=1)
    light = BatchPlan(decode_seqs=4, decode_context=400, num_sampled=4)
    step = group_step_s(model, [busy, light])
    assert step == group_step_s(model, [light, busy])
    # More work on either rank never shortens the shared step.
    assert step >= group_step_s(model, [busy, None]) >= group_step_s(model, [light, None])
    assert step > group_step_s(model, [light, light])
    # An idle rank runs a dummy batch: it adds less than a second busy rank would.
    assert 0 < group_step_s(model, [light, None]) <= group_step_s(model, [light, light])


def _step_with_experts_seeing(model: GpuCostModel, plans: list[BatchPlan], total: int) -> float:
    layers = model.shapes.num_layers
    return max(model.predict(p) + layers * (model.mlp_s(n, total) - model.mlp_s(n))
               for p in plans for n in [p.prefill_tokens + p.decode_seqs])


def test_ranks_within_the_cuda_graph_sizes_are_padded_to_the_busiest_one():
    """vLLM pads every DP rank to the most tokens when all replay a CUDA graph."""
    model = _moe()
    many = BatchPlan(decode_seqs=40, decode_context=40 * 500, num_sampled=40)
    few = BatchPlan(decode_seqs=8, decode_context=8 * 500, num_sampled=8)
    assert model.engine.graph_max_rows >= 40
    step = group_step_s(model, [many, few])
    assert step == pytest.approx(_step_with_experts_seeing(model, [many, few], 80))
    assert step > _step_with_experts_seeing(model, [many, few], 48)


def test_a_rank_above_the_cuda_graph_sizes_runs_every_rank_unpadded():
    model = _moe()
    chunk = model.engine.graph_max_rows + 1024
    busy = BatchPlan(prefill_tokens=chunk, prefill_seqs=1,
                     prefill_attn_causal=chunk * (chunk + 1) // 2, num_sampled=1)
    few = BatchPlan(decode_seqs=8, decode_context=8 * 500, num_sampled=8)
    step = group_step_s(model, [busy, few])
    assert step == pytest.approx(_step_with_experts_seeing(model, [busy, few], chunk + 8))


def test_experts_cost_more_when_the_other_rank_sends_more_tokens():
    model = _moe()
    assert model.mlp_s(8, group_tokens=2048) > model.mlp_s(8, group_tokens=16)


def test_lockstep_ranks_start_every_step_together_and_finish_every_request():
    model = _moe()
    config = SchedulerConfig(policy="chunked", num_blocks=4096, max_num_seqs=8)
    engines = [Engine(Scheduler(config), model) for _ in range(2)]
    requests = [Request(f"r{i}", 0.01 * i, 64 + 16 * i, 8) for i in range(12)]
    result = run_lockstep(requests, engines, model)
    assert all(r.is_finished for r in result.requests)
    steps = {}  # start -> durations of the ranks that ran a step then
    for engine in engines:
        for record in engine.steps:
            steps.setdefault(record.start_s, set()).add(record.duration_s)
    assert all(len(durations) == 1 for durations in steps.values())  # one shared step
    timeline = sorted((start, durations.pop()) for start, durations in steps.items())
    assert all(b[0] >= a[0] + a[1] - 1e-12 for a, b in zip(timeline, timeline[1:],
                                                            strict=False))
    assert any(len({s.start_s for s in e.steps} & {s.start_s for s in o.steps}) > 0
               for e, o in [engines])


def test_a_closed_loop_through_the_lockstep_keeps_its_users_in_flight():
    """Every request is sent once its user's last answer ends: never more than `users` in
    flight, exactly `users` while requests remain, and every request answered."""
    model = _moe()
    config = SchedulerConfig(policy="chunked", num_blocks=4096, max_num_seqs=8)
    engines = [Engine(Scheduler(config), model) for _ in range(2)]
    n, users = 24, 5
    requests = [Request(f"r{i}", 0.0, 48 + 8 * (i % 3), 4 + i % 5) for i in range(n)]
    loop = ClosedLoop(requests, chains_of([None] * n, [0] * n, [0.0] * n), [0.0] * n, users)
    result = run_lockstep(requests, engines, model, loop)
    assert all(r.is_finished for r in result.requests)
    sent = sorted(r.arrival_s for r in requests)
    assert sent[:users] == [0.0] * users
    finishes = sorted(r.finish_s for r in requests)
    # The k-th request after the first `users` goes when the (k - users)-th answer ends.
    assert sent[users:] == finishes[:n - users]
    for t in sent:
        in_flight = sum(1 for r in requests if r.arrival_s <= t < r.finish_s)
        assert in_flight == users if t < sent[-1] else in_flight <= users


def test_one_lockstep_rank_admits_a_closed_loop_as_the_single_engine_replay_does():
    """A closed loop's next request is sent as the last answer's step ends, while the next
    step is being planned: it joins the step after (two after, scheduling ahead), in the
    lockstep replay as in the single-engine one. With one rank the two replays agree on
    every request's first token."""
    for overlapped in (False, True):
        model = _moe(ep=1)
        model.use_engine(EngineOverhead("vllm", 1e-3, 0.0, 1e-5, "", overlapped=overlapped,
                                        graph_max_rows=512))
        config = SchedulerConfig(policy="chunked", num_blocks=4096, max_num_seqs=8)
        first_tokens = []
        for replay in ("lockstep", "single"):
            n, users = 12, 3
            requests = [Request(f"r{i}", 0.0, 64 + 32 * (i % 3), 3 + i % 4) for i in range(n)]
            loop = ClosedLoop(requests, chains_of([None] * n, [0] * n, [0.0] * n),
                              [0.0] * n, users)
            engine = Engine(Scheduler(config), model)
            if replay == "lockstep":
                run_lockstep(requests, [engine], model, loop)
            else:
                run_closed_trace(requests, engine, loop)
            first_tokens.append([r.token_times_s[0] for r in requests])
        assert first_tokens[0] == pytest.approx(first_tokens[1], rel=1e-9), overlapped
