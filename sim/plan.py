"""Building a BatchPlan: each scheduled request adds its tokens and its cost totals.

Pure functions over a plan, shared by the scheduler and by profilers that build plans the
scheduler's way.
"""

from __future__ import annotations

from sim.core import BatchPlan, Request


def add_to_plan(plan: BatchPlan, request: Request, n: int) -> None:
    """Schedule n tokens of request in plan and add them to the plan's cost totals."""
    plan.num_scheduled_tokens[request.request_id] = n
    plan.requests.append(request)
    ctx = request.num_computed_tokens + n  # KV length attended over after this step
    num_tokens = request.prompt_len + len(request.token_times_s)
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


def add_padding(plan: BatchPlan, request: Request) -> None:
    """Static batching: a finished row computed as padding, one row over its whole KV and no
    logits (the scheduler keeps these totals running across a batch's steps)."""
    ctx = request.prompt_len + len(request.token_times_s)
    plan.padding.append(request)
    plan.decode_seqs += 1
    plan.decode_context += ctx
    if ctx > plan.decode_context_max:
        plan.decode_context_max = ctx


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
