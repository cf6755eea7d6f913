"""Scheduling the running requests when speculation is on: a decoding row verifies its
proposals as one chunk, within the step's token budget, with KV for every proposal."""

from __future__ import annotations

from sim.engine.batch_plan import MakeRoom, add_chunks, add_to_plan, add_verify
from sim.engine.core import BatchPlan, Request, RequestStatus
from sim.engine.speculation.speculator import Speculator

_RUNNING = RequestStatus.RUNNING


def add_running_speculative(plan: BatchPlan, running: list[Request], budget: int,
                            make_room: MakeRoom | None, speculator: Speculator) -> int:
    """As batch_plan.add_running, each decoding row with its proposals: 1 + k tokens, k at
    most what the budget and the request's remaining output leave (the token after the
    proposals is always produced). make_room allocates KV for the proposals' positions
    (vLLM's lookahead slots); None: reserved up front. Returns the budget left."""
    partial: list[Request] = []
    for request in running.copy() if make_room else running:
        if request.status is not _RUNNING:
            continue  # evicted earlier in this loop
        num_tokens = request.num_tokens
        if num_tokens - request.num_computed_tokens != 1:
            partial.append(request)
            continue
        if budget < 1:
            break
        remaining = request.max_new_tokens - request.num_output_tokens
        draft = speculator.propose(request, min(budget, remaining) - 1)
        if make_room and not make_room(request, num_tokens + draft.num_tokens, plan):
            continue
        if draft.num_tokens:
            add_verify(plan, request, draft.num_tokens, draft.token_ids)
        else:
            add_to_plan(plan, request, 1)
        budget -= 1 + draft.num_tokens
    return add_chunks(plan, partial, budget, make_room)
