"""A simulation calibrated from a recorded run draws each request's acceptance from that
request's own counters, so acceptance concentrated in a few requests stays concentrated."""

from __future__ import annotations

import json

import pytest

from sim.cost.fixed_backend import ConstantBackend
from sim.engine.core import Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.speculation.config import SpeculativeConfig, SpeculativeConfigError
from sim.engine.step import Engine
from sim.replay.simulation import run_trace


def _counts(decodes: int, drafts: int, accepted: list[int]) -> dict:
    return {"num_decodes": decodes, "num_drafts": drafts, "accepted_per_pos": accepted}


def _record(tmp_path, per_request: dict) -> str:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"results": {"continuous": {
        "spec_acceptance_rates_per_decode": [0.5, 0.5],
        "spec_per_request": per_request}}}))
    return json.dumps({"num_speculative_tokens": 2, "acceptance_rates": str(path)})


def _simulate(config: SpeculativeConfig, ids: list[str]) -> dict[str, dict]:
    requests = [Request(rid, 0.0, 8, 40) for rid in ids]
    scheduler = Scheduler(SchedulerConfig(speculative=config))
    scheduler.speculator.record_requests = True
    run_trace(requests, Engine(scheduler, ConstantBackend(0.01)))
    assert all(r.num_output_tokens == 40 for r in requests)
    return scheduler.speculator.per_request()


def test_recorded_requests_keep_their_own_acceptance(tmp_path):
    config = SpeculativeConfig.from_json(_record(tmp_path, {
        "always": _counts(10, 10, [10, 10]), "never": _counts(10, 10, [0, 0]),
        "undrafted": _counts(10, 0, [0, 0])}))
    counts = _simulate(config, ["always", "never", "undrafted"])
    always, never = counts["always"], counts["never"]
    assert always["accepted_per_pos"] == [always["num_drafts"]] * 2
    assert always["num_drafts"] == always["num_decodes"] > 0
    assert never["accepted_per_pos"] == [0, 0] and never["num_drafts"] > 0
    # a request whose proposer never found proposals decodes one token a step
    assert counts["undrafted"]["num_drafts"] == 0 and counts["undrafted"]["num_decodes"] > 0


def test_a_request_the_record_lacks_draws_at_the_run_totals(tmp_path):
    config = SpeculativeConfig.from_json(_record(tmp_path, {
        "always": _counts(10, 10, [10, 10]), "never": _counts(10, 0, [0, 0])}))
    assert config.recorded is not None and config.recorded.total.draft_share == 0.5
    counts = _simulate(config, ["new"])["new"]
    assert 0 < counts["num_drafts"] < counts["num_decodes"]  # drafts about half its rows
    assert counts["accepted_per_pos"] == [counts["num_drafts"]] * 2  # the drafts' rate: 1.0


def test_draws_do_not_depend_on_the_batch(tmp_path):
    config = SpeculativeConfig.from_json(_record(tmp_path, {"a": _counts(10, 6, [4, 2])}))
    alone = _simulate(config, ["a"])["a"]
    assert _simulate(config, ["a", "b", "c"])["a"] == alone


def test_a_run_without_per_request_counters_gives_average_rates(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"results": {"continuous": {
        "spec_acceptance_rates_per_decode": [0.5, 0.25]}}}))
    config = SpeculativeConfig.from_json(
        json.dumps({"num_speculative_tokens": 2, "acceptance_rates": str(path)}))
    assert config.recorded is None and config.acceptance_rates == (0.5, 0.25)
    assert "recorded" not in config.as_record()


@pytest.mark.parametrize("entry, match", [
    (_counts(10, 11, [0, 0]), "out of range"),
    ({"num_decodes": 3}, "not per-request counters"),
    (_counts(10, 5, [1]), "1 positions"),
])
def test_bad_per_request_counters_are_named(tmp_path, entry, match):
    with pytest.raises(SpeculativeConfigError, match=match):
        SpeculativeConfig.from_json(_record(tmp_path, {"r": entry}))


def test_per_request_counters_are_kept_only_when_asked(tmp_path):
    config = SpeculativeConfig.from_json(_record(tmp_path, {"a": _counts(10, 6, [4, 2])}))
    scheduler = Scheduler(SchedulerConfig(speculative=config))
    run_trace([Request("a", 0.0, 8, 40)], Engine(scheduler, ConstantBackend(0.01)))
    assert scheduler.speculator.num_drafts > 0 and scheduler.speculator.per_request() == {}


def test_recorded_drafts_replay_at_the_output_tokens_where_they_came(tmp_path):
    # "loop" drafted at its 10th, 13th and 15th output token and nowhere else.
    drafts = [[10, 2, 2], [13, 2, 1], [15, 1, 0]]
    config = SpeculativeConfig.from_json(_record(tmp_path, {
        "loop": {**_counts(35, 3, [2, 1]), "drafts": drafts}}))
    counts = _simulate(config, ["loop"])["loop"]
    assert counts["drafts"] == drafts
    # 39 tokens after the first: 6 in the three drafts' steps, 33 one a step, of which the
    # last could propose nothing (no token left to propose)
    assert counts["num_decodes"] == 35 and counts["accepted_per_pos"] == [2, 1]


@pytest.mark.parametrize("drafts", [
    [[10, 3, 0]],  # more proposals than num_speculative_tokens
    [[10, 1, 2]],  # more accepted than proposed
    [[10, 2, 2], [13, 2, 1]],  # two drafts where the counters say one
])
def test_drafts_that_contradict_the_counters_are_refused(tmp_path, drafts):
    counts = {**_counts(36, 1, [1, 0]), "drafts": drafts}
    with pytest.raises(SpeculativeConfigError, match="drafts do not match"):
        SpeculativeConfig.from_json(_record(tmp_path, {"r": counts}))
