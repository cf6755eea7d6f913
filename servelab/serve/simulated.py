"""A Backend that stands in for a GPU: a cost model prices each step, the wall clock paces it.

`servelab serve --simulate` runs the real scheduler and HTTP server on this backend, so the
server behaves like a deployment of any size the cost model describes, with no weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from servelab.serve.token_pool import draw_token
from sim.engine.core import Backend, BatchPlan, Request, StepResult


class SimulatedBackend:
    """Each step takes the cost model's duration of wall-clock time and draws from `pool`.

    A sampled token is drawn from the pool (servelab/serve/token_pool.py) by the request's
    seed and the token's index, so a request's text depends on its seed alone and re-encodes
    to the ids counted. The pool holds no EOS, so every request runs to its max_tokens, as
    the simulator assumes.

    The engine thread spends time of its own between steps (scheduling, updating requests,
    handing tokens to the HTTP side). The simulator's steps run back to back, so when a step
    continues the previous one's work, it is timed from where the previous step was due to
    end: that bookkeeping, and any oversleep of the last sleep, come out of this step's sleep.
    """

    def __init__(self, cost: Backend, pool: Sequence[int],
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.cost = cost
        if not pool:
            raise ValueError("SimulatedBackend: the token pool is empty")
        self.pool = pool
        self._sleep = sleep
        self._clock = clock
        self._due_s: float | None = None  # clock() at which the previous step was due to end

    def execute(self, plan: BatchPlan) -> StepResult:
        """Sleep until the step's predicted end; the sampled tokens and the wall time taken."""
        start_s = self._clock()
        duration_s = self.cost.execute(plan).duration_s
        sampled = sampled_token_ids(plan, self.pool)
        begin_s = start_s
        if self._due_s is not None and continues_running(plan):
            # Credit at most this step's own duration: a backlog larger than that (a machine
            # too slow for the deployment) is dropped rather than repaid by later steps.
            begin_s = max(self._due_s, start_s - duration_s)
        due_s = begin_s + duration_s
        remaining_s = due_s - self._clock()
        if remaining_s > 0:
            self._sleep(remaining_s)
        self._due_s = due_s
        return StepResult(self._clock() - start_s, sampled)

    def free(self, request: Request) -> None:
        """Backend protocol: drawing a token needs no per-request state."""
        self.cost.free(request)


def continues_running(plan: BatchPlan) -> bool:
    """Whether the plan holds a request that ran before this step (not admitted now).

    The engine thread only waits for arrivals when nothing runs, so such a plan follows
    the previous step with no idle time between them, only the engine's bookkeeping.
    """
    return len(plan.admitted) < len(plan.requests) or bool(plan.padding)


def sampled_token_ids(plan: BatchPlan, pool: Sequence[int]) -> dict[str, int]:
    """A token drawn from pool for every row that completes its sequence this step (the
    scheduler's rule: computed + scheduled tokens reach prompt + output so far); prefill
    chunks short of the end and padding rows sample nothing."""
    sampled = {}
    for request, n in zip(plan.requests, plan.num_scheduled_tokens.values(), strict=True):
        if request.num_computed_tokens + n == request.prompt_len + len(request.token_times_s):
            index = len(request.output_token_ids)  # which output token this draw produces
            sampled[request.request_id] = draw_token(pool, request.sampling.seed, index)
    return sampled
