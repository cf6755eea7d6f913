"""The live capacity search: when a p99 is certainly over, the stages and the bisection, the
budget, and a stage's early verdict."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from servelab.bench.capacity import (
    CapacitySearch,
    EarlyVerdict,
    find_live_capacity,
    p99_certainly_over,
)
from servelab.sweeps.grid import CapacitySlo
from sim.engine.core import FinishReason, Request

TARGET = 1.0


@pytest.mark.parametrize("total", [1, 2, 7, 50, 99, 100, 101, 250, 1000])
def test_p99_certainly_over_is_exactly_when_no_other_values_can_pull_it_under(total):
    needed = next(m for m in range(total + 1) if p99_certainly_over(m, total))
    # `needed` values just over and the rest far under: the p99 is still over.
    worst = np.array([TARGET + 1e-9] * needed + [-1e9] * (total - needed))
    assert np.percentile(worst, 99) > TARGET
    # One fewer, the rest far under: the p99 can still come out under the target.
    if needed > 0:
        best = np.array([TARGET + 1.0] * (needed - 1) + [-1e9] * (total - needed + 1))
        assert np.percentile(best, 99) <= TARGET


def test_no_values_are_never_certainly_over():
    assert not p99_certainly_over(0, 0)


class Stages:
    """A server that holds the SLO up to `capacity_rps`; each stage takes `stage_s` of a
    fake clock."""

    def __init__(self, capacity_rps: float, stage_s: float = 10.0) -> None:
        self.capacity_rps = capacity_rps
        self.stage_s = stage_s
        self.now_s = 0.0
        self.rates: list[float] = []

    def clock(self) -> float:
        return self.now_s

    async def run(self, rate_rps: float, limit_s: float) -> dict:
        self.rates.append(rate_rps)
        incomplete = limit_s < self.stage_s
        self.now_s += min(limit_s, self.stage_s)
        return {"rate_rps": rate_rps, "passed": rate_rps <= self.capacity_rps,
                "incomplete": incomplete}


def search(stages: Stages, **kwargs):
    return asyncio.run(find_live_capacity(stages.run, CapacitySearch(**kwargs), stages.clock))


def test_stages_double_until_a_break_then_bisect_to_the_tolerance():
    stages = Stages(capacity_rps=10.0)
    result = search(stages, start_rate_rps=1.0, rel_tol=0.05)
    assert stages.rates[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert result.ended == "bracketed"
    assert 10.0 / 1.05 <= result.rate_rps <= 10.0
    broke = min(r for r in stages.rates if r > 10.0)
    assert broke / result.rate_rps <= 1.05


def test_a_first_stage_that_breaks_steps_down():
    stages = Stages(capacity_rps=3.0)
    result = search(stages, start_rate_rps=20.0, rel_tol=0.05)
    assert stages.rates[:4] == [20.0, 10.0, 5.0, 2.5]
    assert 3.0 / 1.05 <= result.rate_rps <= 3.0


def test_the_budget_ends_the_search_with_the_best_rate_so_far():
    stages = Stages(capacity_rps=100.0, stage_s=10.0)
    result = search(stages, start_rate_rps=1.0, budget_s=35.0)
    assert stages.rates == [1.0, 2.0, 4.0, 8.0]  # the fourth stage is cut by the budget
    assert result.ended == "budget" and result.rate_rps == 4.0


def test_a_server_that_holds_no_rate_reports_zero():
    stages = Stages(capacity_rps=0.0)
    result = search(stages, start_rate_rps=1.0)
    assert result.rate_rps == 0.0 and result.ended == "none-held"


def request(rid: str, sent_s: float, token_times_s: list[float], done: bool) -> Request:
    record = Request(rid, sent_s, 4, 8)
    record.token_times_s = list(token_times_s)
    record.finish_reason = FinishReason.LENGTH if done else None
    return record


def test_early_verdict_counts_a_request_still_waiting_past_the_ttft_target():
    slo = CapacitySlo(ttft_p99_ms=500.0, itl_p99_ms=1000.0)
    verdict = EarlyVerdict(slo, num_requests=100, num_gaps=700)
    records = [request("a", 0.0, [0.9], True), request("b", 0.0, [], False),
               request("c", 5.0, [], False)]
    sent = {"a", "b", "c"}
    assert not verdict(records, sent, now_s=0.4)  # a is over; b has waited 0.4 s
    assert verdict(records, sent, now_s=0.6)  # now b too: 2 of 100 cannot be pulled under
    assert not verdict(records, {"a"}, now_s=0.6)  # b, unsent, waits on nothing


def test_early_verdict_counts_token_gaps_against_the_itl_target():
    slo = CapacitySlo(ttft_p99_ms=10_000.0, itl_p99_ms=100.0)
    verdict = EarlyVerdict(slo, num_requests=2, num_gaps=100)
    slow = request("a", 0.0, [0.01, 0.5], False)  # one gap over
    assert not verdict([slow], {"a"}, now_s=0.55)
    assert verdict([slow], {"a"}, now_s=0.7)  # and the next token overdue


def test_early_verdict_stops_at_a_failed_request():
    slo = CapacitySlo()
    failed = request("a", 0.0, [], True)
    failed.finish_reason = FinishReason.FAILED
    assert EarlyVerdict(slo, 1000, 1000)([failed], {"a"}, now_s=0.0)
