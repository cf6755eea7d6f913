"""Building a BatchPlan: each scheduled request adds its tokens and its cost totals.

Pure functions over a plan, shared by the scheduler and by profilers that build plans the
scheduler's way.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.engine.core import BatchPlan, Request, RequestStatus

# Allocates a request's KV up to a token count, evicting running requests from the tail of
# the running queue if it must; False when the request itself was evicted.
MakeRoom = Callable[[Request, int, BatchPlan], bool]
_RUNNING = RequestStatus.RUNNING  # (an Enum member looked up per row costs as much as a row)


def add_to_plan(plan: BatchPlan, request: Request, n: int) -> None:
    """Schedule n tokens of request in plan and add them to the plan's cost totals."""
    plan.num_scheduled_tokens[request.request_id] = n
    plan.requests.append(request)
    ctx = request.num_computed_tokens + n  # KV length attended over after this step
    num_tokens = request.num_tokens
    if ctx == num_tokens:
        plan.num_sampled += 1
    if n == 1 and ctx == num_tokens:
        plan.decode_seqs += 1
        plan.decode_context += ctx
        if ctx > plan.decode_context_max:
            plan.decode_context_max = ctx
    else:
        plan.prefill_tokens += n
        plan.prefill_attn += n * ctx
        plan.prefill_attn_causal += n * ctx - n * (n - 1) // 2
        plan.prefill_seqs += 1
        if n > plan.prefill_chunk_max:
            plan.prefill_chunk_max = n
        if ctx > plan.prefill_context_max:
            plan.prefill_context_max = ctx


def add_verify(plan: BatchPlan, request: Request, k: int, token_ids: tuple[int, ...]) -> None:
    """Speculative decoding: a decoding row verifies k proposals, computing its last token
    and them as one (k + 1)-token chunk that samples at every position (k + 1 logits rows:
    the target's choice after each proposal and after the last); cost models price it as the
    chunk it is. token_ids: the proposals' ids (empty in pure simulation)."""
    rid = request.request_id
    plan.num_scheduled_tokens[rid] = n = k + 1
    plan.requests.append(request)
    plan.num_spec_tokens[rid] = k
    if token_ids:
        plan.spec_token_ids[rid] = list(token_ids)
    ctx = request.num_computed_tokens + n
    plan.num_sampled += n
    plan.prefill_tokens += n
    plan.prefill_attn += n * ctx
    plan.prefill_attn_causal += n * ctx - n * (n - 1) // 2
    plan.prefill_seqs += 1
    plan.prefill_chunk_max = max(plan.prefill_chunk_max, n)
    plan.prefill_context_max = max(plan.prefill_context_max, ctx)


def add_padding(plan: BatchPlan, request: Request) -> None:
    """Static batching: a finished row computed as padding, one row over its whole KV and no
    logits."""
    ctx = request.num_tokens
    add_padding_rows(plan, [request], ctx, ctx)


def add_padding_rows(plan: BatchPlan, rows: list[Request], context: int,
                     context_max: int) -> None:
    """Finished rows computed as padding, given the sum and the longest of their KV lengths
    (static batching keeps those running across a batch's steps)."""
    plan.padding.extend(rows)
    plan.decode_seqs += len(rows)
    plan.decode_context += context
    if context_max > plan.decode_context_max:
        plan.decode_context_max = context_max


def add_decodes(plan: BatchPlan, requests: list[Request]) -> None:
    """Add one-token decodes; the per-row hot path, so totals accumulate in locals."""
    if not requests:
        return
    counts = plan.num_scheduled_tokens
    context = 0
    context_max = plan.decode_context_max
    for request in requests:
        counts[request.request_id] = 1
        ctx = request.num_computed_tokens + 1
        context += ctx
        if ctx > context_max:
            context_max = ctx
    plan.requests.extend(requests)
    plan.decode_seqs += len(requests)
    plan.num_sampled += len(requests)
    plan.decode_context += context
    plan.decode_context_max = context_max


def remove_from_plan(plan: BatchPlan, request: Request, n: int) -> None:
    """Take a request's totals back out of the plan (the maxima stay: an upper bound)."""
    ctx = request.num_computed_tokens + n
    k = plan.num_spec_tokens.pop(request.request_id, None) if plan.num_spec_tokens else None
    if k:
        plan.spec_token_ids.pop(request.request_id, None)
        plan.num_sampled -= k + 1  # a verifying row's logits rows; its chunk totals go below
    if ctx == request.num_tokens:
        plan.num_sampled -= 1
    if n == 1 and ctx == request.num_tokens:
        plan.decode_seqs -= 1
        plan.decode_context -= ctx
    else:
        plan.prefill_tokens -= n
        plan.prefill_attn -= n * ctx
        plan.prefill_attn_causal -= n * ctx - n * (n - 1) // 2
        plan.prefill_seqs -= 1


def add_running(plan: BatchPlan, running: list[Request], budget: int,
                make_room: MakeRoom | None, block_size: int) -> int:
    """Schedule the running requests, in running order, from `budget` tokens: decodes first,
    then chunks of unfinished prefills (stall-free order); make_room finds KV as sequences
    grow (None when it was reserved up front). Returns the budget left."""
    partial: list[Request] = []
    requests = plan.requests
    counts = plan.num_scheduled_tokens
    first = len(requests)  # decodes from here on are not yet in the plan's totals
    context = 0
    context_max = plan.decode_context_max
    # make_room may evict any running request the waiting queue names: iterate over a copy.
    for request in running.copy() if make_room else running:
        if request.status is not _RUNNING:
            continue  # evicted earlier in this loop
        num_tokens = request.prompt_len + len(request.token_times_s)  # (num_tokens, inlined)
        if num_tokens - request.num_computed_tokens != 1:
            partial.append(request)
            continue
        if budget < 1:
            break
        # A decode holds KV for num_tokens - 1 tokens, so it can need a new block only when
        # those fill their last block. The totals so far go into the plan first: a victim
        # may be a decode scheduled above, which eviction takes back out of the plan.
        if make_room and (num_tokens - 1) % block_size == 0:
            _add_decode_totals(plan, len(requests) - first, context, context_max)
            first, context = len(requests), 0
            if not make_room(request, num_tokens, plan):
                continue
            context_max = plan.decode_context_max
        requests.append(request)
        counts[request.request_id] = 1
        context += num_tokens
        if num_tokens > context_max:
            context_max = num_tokens
        budget -= 1
    _add_decode_totals(plan, len(requests) - first, context, context_max)
    return add_chunks(plan, partial, budget, make_room)


def _add_decode_totals(plan: BatchPlan, num: int, context: int, context_max: int) -> None:
    """add_decodes' totals for num decodes already listed, accumulated by add_running."""
    if num:
        plan.decode_seqs += num
        plan.num_sampled += num
        plan.decode_context += context
        plan.decode_context_max = context_max


def add_chunks(plan: BatchPlan, partial: list[Request], budget: int,
               make_room: MakeRoom | None) -> int:
    """Running requests with prompt (or recompute) tokens left, in order: a chunk each from
    the budget while it lasts. Returns the budget left."""
    for request in partial:
        if budget < 1 or request.status is not _RUNNING:
            continue
        n = min(request.num_tokens - request.num_computed_tokens, budget)
        if make_room and not make_room(request, request.num_computed_tokens + n, plan):
            continue
        add_to_plan(plan, request, n)
        budget -= n
    return budget
