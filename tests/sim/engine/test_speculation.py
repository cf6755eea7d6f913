"""Speculative decoding in the scheduler: outputs equal greedy decoding, tokens per step are
accounted exactly, lookahead KV is conserved, TTFT does not move."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost.fixed_backend import ConstantBackend
from sim.engine.core import BatchPlan, FinishReason, Request, StepResult
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.speculation.config import SpeculativeConfig, SpeculativeConfigError
from sim.engine.speculation.ngram import propose_ngram
from sim.engine.step import Engine
from sim.replay.simulation import run_trace

STEP_S = 0.01


def next_token(tokens: list[int]) -> int:
    """A toy greedy model over 5 tokens: repetitive enough for n-gram lookups to hit."""
    return (tokens[-1] * 3 + tokens[-2] + len(tokens) // 9) % 5


class ToyModel:
    """A real-backend stand-in: samples next_token and verifies proposals greedily."""

    def execute(self, plan: BatchPlan) -> StepResult:
        sampled, produced = {}, {}
        for request, n in zip(plan.requests, plan.num_scheduled_tokens.values(), strict=True):
            drafts = plan.spec_token_ids.get(request.request_id, [])
            if request.num_computed_tokens + n - len(drafts) != request.num_tokens:
                continue  # a prefill chunk that does not end the prompt
            seq = request.token_ids() + drafts
            targets = [next_token(seq[:request.num_tokens + i]) for i in range(len(drafts) + 1)]
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
                accepted += 1
            if request.request_id in plan.num_spec_tokens:
                produced[request.request_id] = targets[:accepted + 1]
            else:
                sampled[request.request_id] = targets[0]
        return StepResult(STEP_S, sampled, produced)

    def free(self, request: Request) -> None:
        pass


def requests(specs: list[tuple[int, int, float]]) -> list[Request]:
    return [Request(f"r{i}", arrival, plen, out,
                    prompt_token_ids=[(i * 7 + j * j) % 5 for j in range(plen)])
            for i, (plen, out, arrival) in enumerate(specs)]


def run(specs, backend, speculative=None, **config) -> tuple[list[Request], Scheduler]:
    reqs = requests(specs)
    sched = Scheduler(SchedulerConfig(speculative=speculative, **config))
    engine = Engine(sched, backend)
    run_trace(reqs, engine)
    return reqs, sched


NGRAM = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)
specs_st = st.lists(st.tuples(st.integers(2, 40), st.integers(1, 30),
                              st.floats(0, 0.2)), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(specs_st, st.sampled_from(["continuous", "recompute", "chunked"]),
       st.integers(6, 40))
def test_speculation_outputs_equal_greedy_decoding(specs, policy, num_blocks):
    budget = {"token_budget": 48, "max_num_seqs": 8} if policy == "chunked" else {}
    plain, _ = run(specs, ToyModel(), None, policy=policy, num_blocks=num_blocks,
                   block_size=4, max_model_len=80, **budget)
    spec, sched = run(specs, ToyModel(), NGRAM, policy=policy, num_blocks=num_blocks,
                      block_size=4, max_model_len=80, **budget)
    for a, b in zip(plain, spec, strict=True):
        assert a.finish_reason == b.finish_reason
        if a.finish_reason.value == "length":
            assert b.output_token_ids == a.output_token_ids
            assert len(b.token_times_s) == b.max_new_tokens
    sched.block_manager.check()
    assert sched.block_manager.num_used_blocks == 0


class Recorder:
    """A constant-time backend that checks each plan, its KV, and the tokens the previous
    step added: one per sampling row plus the proposals accepted, exactly."""

    def __init__(self, sched: Scheduler, budget: int) -> None:
        self.sched, self.budget = sched, budget
        self.last: tuple[BatchPlan, dict[str, int], int] | None = None

    def check_last(self) -> None:
        if self.last is None:
            return
        plan, before, accepted = self.last
        gained = sum(r.num_output_tokens - before[r.request_id] for r in plan.requests)
        sampling_rows = plan.num_sampled - sum(plan.num_spec_tokens.values())
        assert gained == sampling_rows + self.sched.speculator.num_accepted_tokens - accepted

    def execute(self, plan: BatchPlan) -> StepResult:
        self.check_last()
        assert sum(plan.num_scheduled_tokens.values()) <= self.budget
        bm = self.sched.block_manager
        bm.check()
        for request, n in zip(plan.requests, plan.num_scheduled_tokens.values(), strict=True):
            assert len(bm.block_table(request.request_id)) * bm.block_size >= (
                request.num_computed_tokens + n)  # KV for every proposal's position
        self.last = (plan, {r.request_id: r.num_output_tokens for r in plan.requests},
                     self.sched.speculator.num_accepted_tokens)
        return StepResult(STEP_S)

    def free(self, request: Request) -> None:
        pass


@settings(max_examples=40, deadline=None)
@given(specs_st, st.sampled_from(["continuous", "recompute", "chunked"]), st.integers(8, 40),
       st.lists(st.floats(0, 1), min_size=4, max_size=4))
def test_simulated_speculation_accounts_tokens_and_blocks(specs, policy, num_blocks, rates):
    config = SpeculativeConfig(num_speculative_tokens=4,
                               acceptance_rates=tuple(sorted(rates, reverse=True)))
    sched = Scheduler(SchedulerConfig(policy=policy, num_blocks=num_blocks, block_size=4,
                                      max_model_len=80, token_budget=80, max_num_seqs=8,
                                      speculative=config))
    recorder = Recorder(sched, 80)
    reqs = [Request(f"r{i}", a, p, o) for i, (p, o, a) in enumerate(specs)]
    run_trace(reqs, Engine(sched, recorder))
    recorder.check_last()
    assert all(r.num_output_tokens == r.max_new_tokens for r in reqs
               if r.finish_reason is not FinishReason.REJECTED)
    spec = sched.speculator
    assert spec.num_accepted_tokens == sum(spec.accepted_per_pos)
    sched.block_manager.check()
    assert sched.block_manager.num_used_blocks == 0


def test_verified_row_gains_one_plus_accepted_tokens_and_rolls_back_the_rest():
    config = SpeculativeConfig(num_speculative_tokens=4, acceptance_rates=(1.0, 1.0, 0.0, 0.0))
    sched = Scheduler(SchedulerConfig(policy="recompute", num_blocks=64, block_size=4,
                                      speculative=config))
    request = Request("a", 0.0, 8, 20)
    sched.add(request)
    sched.update(plan := sched.schedule(0.0), StepResult(STEP_S), STEP_S)  # prefill
    assert request.num_output_tokens == 1 and not plan.num_spec_tokens
    plan = sched.schedule(STEP_S)
    assert plan.num_scheduled_tokens["a"] == 5 and plan.num_spec_tokens == {"a": 4}
    assert len(sched.block_manager.block_table("a")) == 4  # lookahead: 13 positions
    sched.update(plan, StepResult(STEP_S), 2 * STEP_S)
    assert request.num_output_tokens == 1 + 1 + 2  # the token after 2 accepted, and them
    assert request.num_computed_tokens == request.num_tokens - 1
    assert len(sched.block_manager.block_table("a")) == 3  # rejected lookahead released


def test_speculation_leaves_ttft_unchanged():
    specs = [(30, 20, 0.0), (12, 20, 0.005)]
    config = SpeculativeConfig(num_speculative_tokens=4, acceptance_rates=(0.9, 0.7, 0.5, 0.3))
    plain = [Request(f"r{i}", a, p, o) for i, (p, o, a) in enumerate(specs)]
    spec = [Request(f"r{i}", a, p, o) for i, (p, o, a) in enumerate(specs)]
    for reqs, speculative in ((plain, None), (spec, config)):
        sched = Scheduler(SchedulerConfig(policy="chunked", token_budget=64, max_num_seqs=8,
                                          speculative=speculative))
        run_trace(reqs, Engine(sched, ConstantBackend(STEP_S)))
    assert [r.token_times_s[0] for r in spec] == [r.token_times_s[0] for r in plain]
    assert spec[0].finish_s < plain[0].finish_s  # fewer steps to the same output


def test_ngram_proposes_what_followed_the_longest_earlier_match():
    assert propose_ngram([1, 2, 3, 4, 1, 2], 2, 1, 3) == [3, 4]
    assert propose_ngram([5, 6, 7], 3, 1, 2) == []
    assert propose_ngram([9, 1, 2, 9, 3, 1, 2], 3, 1, 2) == [9, 3, 1]


@pytest.mark.parametrize("text, match", [
    ('{"method": "medusa"}', "method"), ('{"num_speculative_tokens": 0}', ">= 1"),
    ('{"bogus": 1}', "unknown keys"), ("[1]", "object"), ("{", "not JSON"),
    ('{"num_speculative_tokens": 2, "acceptance_rates": [0.5, 0.6]}', "increase"),
    ('{"method": "draft_model"}', "draft_num_layers"),
    ('{"method": "draft_model", "model": "tiny", "draft_num_layers": 1}', "one of"),
    ('{"method": "eagle", "draft_num_layers": 1}', "draft_model"),
    ('{"method": "draft_model", "draft_num_layers": 0}', ">= 1"),
    ('{"drafter_priced": true}', "unknown keys"),
])
def test_bad_speculative_config_is_named(text, match):
    with pytest.raises(SpeculativeConfigError, match=match):
        SpeculativeConfig.from_json(text)


def test_a_drafter_method_is_simulated_only_where_its_passes_are_priced():
    """Without a cost model that adds the drafter's passes (sim.cost.drafter), a simulation
    refuses eagle, mtp and draft_model; marked priced, it draws acceptance as for ngram."""
    config = SpeculativeConfig(method="eagle", num_speculative_tokens=2,
                               acceptance_rates=(0.5, 0.25))
    requests = [Request("a", 0.0, 8, 6)]
    with pytest.raises(ValueError, match="does not price its drafter"):
        run_trace(requests, Engine(Scheduler(SchedulerConfig(speculative=config)),
                                   ConstantBackend(0.01)))
    priced = SpeculativeConfig(method="eagle", num_speculative_tokens=2,
                               acceptance_rates=(0.5, 0.25), drafter_priced=True)
    requests = [Request("a", 0.0, 8, 6)]
    scheduler = Scheduler(SchedulerConfig(speculative=priced))
    run_trace(requests, Engine(scheduler, ConstantBackend(0.01)))
    assert requests[0].num_output_tokens == 6 and scheduler.speculator.num_drafts > 0
    assert "drafter_priced" not in priced.as_record()


def test_speculation_needs_an_iteration_level_policy():
    with pytest.raises(ValueError, match="static"):
        SchedulerConfig(policy="static", speculative=NGRAM)


def test_acceptance_rates_come_from_a_recorded_run(tmp_path):
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps({"results": {"chunked": {
        "spec_acceptance_rates_per_decode": [0.5, 0.25]}}}))
    text = json.dumps({"num_speculative_tokens": 2, "acceptance_rates": str(run_json)})
    assert SpeculativeConfig.from_json(text).acceptance_rates == (0.5, 0.25)
    run_json.write_text(json.dumps({"results": {"chunked": {}}}))
    with pytest.raises(SpeculativeConfigError, match="found 0"):
        SpeculativeConfig.from_json(text)
    with pytest.raises(SpeculativeConfigError, match="not a run"):
        SpeculativeConfig.from_json(json.dumps({"acceptance_rates": str(tmp_path / "no")}))
