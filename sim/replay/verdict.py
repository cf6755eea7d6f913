"""A simulated run's SLO verdict, known before the run ends: stop once it certainly fails.

A run fails a p99 target once so many of its values are over it that the percentile exceeds
it whatever the others turn out to be. What is certain mid-run, with decode rows fast-forwarded
(sim.engine.fast_forward copies a running row's token times only when it leaves):
  - TTFT: a request never scheduled yet whose wait alone exceeds the target (its first token
    comes at the end of a step that starts no earlier than now); a request that has its
    first token, or has finished;
  - ITL: the gaps of finished requests (a running row's times are not all written yet).
Totals are upper bounds (every request that fits the engine completes; each has at most
max_new_tokens - 1 gaps), and an upper bound on the total only makes the test stricter.
Times are compared as sim.replay.metrics computes them ((later - earlier) * 1e3 ms), so a value
counted over is over in the summary too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from sim.engine.core import FinishReason, Request
from sim.replay.metrics import inter_token_latencies_ms

_DONE = (FinishReason.LENGTH, FinishReason.STOP)
_ITL_BATCH = 256  # finished requests whose gaps are counted together (numpy, not per token)


def p99_certainly_over(num_over: int, num_total: int) -> bool:
    """Whether the 99th percentile (numpy's linear interpolation) of num_total values exceeds
    a target once num_over of them do, whatever the others are: both values it interpolates
    between are then over."""
    return num_total > 0 and num_over >= num_total - math.floor(0.99 * (num_total - 1))


def _needed(num_total: int) -> float:
    """The fewest values over a target that put the p99 of num_total over it (inf: none)."""
    needed = num_total - math.floor(0.99 * (num_total - 1))
    return needed if num_total > 0 and p99_certainly_over(needed, num_total) else math.inf


class VerdictReached(Exception):  # noqa: N818 (a stop signal, not an error)
    """Raised by an SloWatch from a replay's step hook: the run certainly fails its SLO."""

    def __init__(self, stopped_s: float) -> None:
        super().__init__(stopped_s)  # (SimPy rebuilds a process's exception from its args)
        self.stopped_s = stopped_s

    def __str__(self) -> str:
        return f"the SLO verdict was certain at t={self.stopped_s:.3f}s"


class SloWatch:
    """A replay's on_step hook that raises VerdictReached once the run's p99 TTFT or p99 ITL
    certainly exceeds its target. `never_fits` (SchedulerConfig.never_fits) names the
    requests every engine rejects: they count in neither percentile."""

    def __init__(self, requests: Sequence[Request], ttft_p99_ms: float, itl_p99_ms: float,
                 never_fits: Callable[[int], str]) -> None:
        self.ttft_ms, self.itl_ms = ttft_p99_ms, itl_p99_ms
        kept = [r for r in requests if not never_fits(r.prompt_len + r.max_new_tokens)]
        self.pending = kept  # in arrival order: the first `passed` are old enough to judge
        self.passed = 0
        # Before this time the next pending request cannot be old enough (a hair early, so
        # the exact test in _pass decides): most steps need no look at the queue.
        self._early_s = ttft_p99_ms * 1e-3 * (1 - 1e-6)
        self.due_s = kept[0].arrival_s + self._early_s if kept else math.inf
        self.tracked = {id(r) for r in kept}  # (a P/D prefill stand-in is not one of them)
        self.judged: set[int] = set()  # id() of requests whose TTFT is counted
        self.num_requests = len(kept)
        self.num_gaps = sum(max(r.max_new_tokens - 1, 0) for r in kept)
        self.ttft_over = self.itl_over = 0
        self.unjudged_gaps: list[Request] = []  # finished, gaps not counted yet
        # The counts over the targets at which each p99 is certainly over (p99_certainly_over,
        # solved once: the hook runs after every step).
        self.ttft_needed = _needed(self.num_requests)
        self.itl_needed = _needed(self.num_gaps)

    def __call__(self, now: float, finished: list[Request]) -> None:
        if finished:
            tracked = self.tracked
            for request in finished:
                if id(request) in tracked:
                    self._finished(request)
        if now > self.due_s:
            self._pass(now)
        if len(self.unjudged_gaps) >= _ITL_BATCH:
            self._count_gaps()
        if self.ttft_over >= self.ttft_needed or self.itl_over >= self.itl_needed:
            raise VerdictReached(now)

    def _finished(self, request: Request) -> None:
        if request.finish_reason not in _DONE:
            return  # aborted: the run fails anyway (CapacitySlo.met counts failures)
        self._judge(request, request.token_times_s[0])
        self.unjudged_gaps.append(request)

    def _judge(self, request: Request, first_token_s: float | None) -> None:
        key = id(request)
        if key not in self.judged:
            self.judged.add(key)
            # (no first token: its wait alone is over, and the token comes later still)
            self.ttft_over += (first_token_s is None
                               or (first_token_s - request.arrival_s) * 1e3 > self.ttft_ms)

    def _pass(self, now: float) -> None:
        """Judge the requests that arrived more than the TTFT target before now."""
        pending, i, ttft_ms = self.pending, self.passed, self.ttft_ms
        while i < len(pending) and (now - pending[i].arrival_s) * 1e3 > ttft_ms:
            request = pending[i]
            if request.first_scheduled_s is None:
                self._judge(request, None)
            elif request.token_times_s:  # (a fast-forwarded row's first token may be unwritten)
                self._judge(request, request.token_times_s[0])
            i += 1
        self.passed = i
        self.due_s = pending[i].arrival_s + self._early_s if i < len(pending) else math.inf

    def _count_gaps(self) -> None:
        gaps = inter_token_latencies_ms(self.unjudged_gaps)
        self.itl_over += int((gaps > self.itl_ms).sum())
        self.unjudged_gaps = []
