"""Capacity at SLO on a live server: replay the trace at rising rates (stages, each rate
`growth` times the last) until p99 TTFT or p99 ITL breaks its target, then bisect between
the highest rate that held and the lowest that broke, within a time budget.

A stage stops as soon as its verdict is certain: when so many of its requests (or, for ITL,
of its token gaps) are already over the target, counting those still waiting whose wait
alone exceeds it, that the p99 exceeds it whatever the rest do.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from servelab.sweeps.grid import CapacitySlo
from sim.engine.core import FinishReason, Request
from sim.replay.verdict import p99_certainly_over


@dataclass(frozen=True)
class CapacitySearch:
    """How the search moves: first rate, growth per stage, when to stop."""

    start_rate_rps: float
    growth: float = 2.0  # each stage's rate over the last until one breaks the SLO
    rel_tol: float = 0.05  # bisection ends once the breaking rate is within this of the held
    budget_s: float = 900.0  # the whole search, stages and drains
    max_stages: int = 24

    def __post_init__(self) -> None:
        for key in ("start_rate_rps", "rel_tol", "budget_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"capacity search {key} must be > 0, got {getattr(self, key)}")
        if not self.growth > 1:
            raise ValueError(f"capacity search growth must be > 1, got {self.growth}")
        if self.max_stages < 1:
            raise ValueError(f"capacity search max_stages must be >= 1, got {self.max_stages}")


@dataclass(frozen=True)
class CapacityResult:
    """The highest rate that held the SLO (0 if none did) and every stage's row."""

    rate_rps: float
    stages: list[dict]
    ended: str  # why the search stopped: "bracketed", "budget", "max-stages", "none-held"


# Runs one stage at a rate within a time limit; its row: rate_rps, passed, and whether it
# was cut short by the limit (`incomplete`), plus whatever it measured.
RunStage = Callable[[float, float], Awaitable[dict]]


@dataclass(frozen=True)
class EarlyVerdict:
    """A StopCheck for one stage: stop once it certainly fails the SLO."""

    slo: CapacitySlo
    num_requests: int
    num_gaps: int  # token gaps the stage's requests will have in all (output_len - 1 each)

    def __call__(self, records: list[Request], sent: set[str], now_s: float) -> bool:
        ttft_over = itl_over = 0
        ttft_s, itl_s = self.slo.ttft_p99_ms / 1e3, self.slo.itl_p99_ms / 1e3
        for record in records:
            if record.request_id not in sent:
                continue
            if record.finish_reason is FinishReason.FAILED:
                return True  # a failed request fails the stage (CapacitySlo.met)
            times = record.token_times_s
            running = record.finish_reason is None
            if not times:
                ttft_over += running and now_s - record.arrival_s > ttft_s
                continue
            ttft_over += times[0] - record.arrival_s > ttft_s
            itl_over += sum(b - a > itl_s for a, b in zip(times, times[1:], strict=False))
            itl_over += running and now_s - times[-1] > itl_s
        return (p99_certainly_over(ttft_over, self.num_requests)
                or p99_certainly_over(itl_over, self.num_gaps))


async def find_live_capacity(run_stage: RunStage, search: CapacitySearch,
                             clock: Callable[[], float] = time.perf_counter,
                             on_stage: Callable[[dict], None] | None = None
                             ) -> CapacityResult:
    """Stages up (or down, if the first breaks) by `growth`, then bisection (geometric)."""
    start_s = clock()
    held, broke = None, None  # highest rate that held, lowest that broke
    rate, stages, ended = search.start_rate_rps, [], "max-stages"
    while len(stages) < search.max_stages:
        left_s = search.budget_s - (clock() - start_s)
        if left_s <= 0:
            ended = "budget"
            break
        row = await run_stage(rate, left_s)
        stages.append(row)
        if on_stage is not None:
            on_stage(row)
        if row["incomplete"]:
            ended = "budget"
            break
        if row["passed"]:
            held = rate
        else:
            broke = rate
        if held is not None and broke is not None and broke / held <= 1 + search.rel_tol:
            ended = "bracketed"
            break
        rate = _next_rate(rate, held, broke, search.growth)
        if held is None and rate < search.start_rate_rps / search.growth ** 8:
            ended = "none-held"
            break
    return CapacityResult(held or 0.0, stages, ended)


def _next_rate(rate: float, held: float | None, broke: float | None, growth: float) -> float:
    if broke is None:
        return rate * growth
    if held is None:
        return rate / growth
    return math.sqrt(held * broke)
