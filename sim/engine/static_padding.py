"""Static batching: a whole batch admitted at once, its finished rows kept as padding."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.engine.batch_plan import add_decodes, add_padding_rows, add_to_plan
from sim.engine.batching import SchedulerSteps
from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, FinishReason, Request, RequestStatus


class StaticBatching:
    """Batch at a time: a new batch only once every row of the last one finished; it
    reserves prompt + max_new_tokens per request and prefills the whole batch in one step."""

    reserves_full = True
    splits_prompts = False
    budgeted = False  # bounded by max_num_seqs and KV, not by a token budget
    allows_fast_forward = False  # padding rows are per-row work a fast-forwarded row does not do

    def __init__(self) -> None:
        self.padding = Padding()  # the current batch's finished rows

    def schedule(self, scheduler: SchedulerSteps, plan: BatchPlan, now: float) -> None:
        running, waiting, padding = scheduler.running, scheduler.waiting, self.padding
        if not running and not padding.rows:
            bm = scheduler.block_manager
            while waiting and len(running) < scheduler.max_num_seqs:
                request = waiting.head(now)
                prefix = bm.cached_prefix(request) if bm.enable_caching else ()
                need = request.prompt_len + request.max_new_tokens
                if not bm.try_allocate(request.request_id, need, prefix):
                    break
                waiting.take(request)
                hit = len(prefix) * bm.block_size
                scheduler.start(request, plan, now, max(hit, request.num_external_tokens), hit)
        if plan.admitted:  # the batch's prefill step
            for request in running:
                add_to_plan(plan, request, request.num_tokens - request.num_computed_tokens)
        else:
            add_decodes(plan, running)
        if padding.rows:
            padding.add_to(plan)

    def hold(self, request: Request, reason: FinishReason) -> bool:
        """Every row stays in the batch as padding until the whole batch ends."""
        self.padding.add(request, reason)
        return True

    def returned(self, scheduler: SchedulerSteps, finished: list[Request],  # noqa: ARG002
                 now: float) -> list[Request]:
        """Rows are returned together, when the batch ends: none before."""
        if not scheduler.running and self.padding.rows:
            return self.padding.release(now, scheduler.block_manager)
        return []

    @property
    def held_rows(self) -> list[Request]:
        return self.padding.rows


@dataclass(slots=True)
class Padding:
    """Finished rows of the current static batch: computed like decodes (no output) and
    holding their KV until the whole batch ends, when their responses are returned
    (Orca's critique of static batching). Their KV lengths stay fixed while they wait, so
    the totals are kept running and a step costs O(active rows)."""

    rows: list[Request] = field(default_factory=list)
    context: int = 0  # sum of the rows' KV lengths
    context_max: int = 0  # longest row KV length

    def add(self, request: Request, reason: FinishReason) -> None:
        """request finished (for `reason`): it stays in the batch until the batch ends."""
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self.rows.append(request)
        ctx = request.num_tokens
        self.context += ctx
        self.context_max = max(self.context_max, ctx)

    def add_to(self, plan: BatchPlan) -> None:
        """Put the rows in a step's plan as one-token decodes that sample nothing."""
        add_padding_rows(plan, self.rows, self.context, self.context_max)

    def release(self, now: float, block_manager: BlockManager) -> list[Request]:
        """The batch ended at `now`: free every row's KV and return the rows."""
        batch, self.rows = self.rows, []
        self.context = self.context_max = 0
        for request in batch:
            block_manager.free(request.request_id)
            if request.finish_s is None:  # aborted rows keep the time they were aborted
                request.finish_s = now
        return batch
