"""The scheduler's side of deferred decode rows (sim.engine.deferred): switching them on, and the
quiet runs of steps (sim.replay.coast) that only decode them."""

from __future__ import annotations

from sim.engine.core import FinishReason, Request
from sim.engine.deferred import DeferredDecodes


class DecodeDeferral:
    """Scheduler methods for deferred decode rows; `deferred` is None while every decode row
    is listed in the plans (the default)."""

    deferred: DeferredDecodes | None = None

    def defer_decodes(self) -> bool:
        """Keep decode rows out of the plans' row lists (sim.engine.deferred): for a backend that
        prices a plan from its totals and samples no tokens. Returns whether it is on: not
        when a part does per-row work it does not model (static batching's padding, swap's
        copies, a fair queue's charges)."""
        if self._live:
            raise RuntimeError("defer_decodes must be set before the first request")
        if (self.batching.allows_deferral and self.eviction.allows_deferral
                and self.waiting.allows_deferral):
            self.deferred = DeferredDecodes(
                self.block_manager.block_size, not self.batching.reserves_full, self._caching,
                self.waiting.sorts_running, self.block_manager.block_table)
        return self.deferring

    @property
    def deferring(self) -> bool:
        """Whether decode rows are kept out of the plans (defer_decodes)."""
        return self.deferred is not None

    def quiet_steps(self, limit: int) -> int:
        """How many of the next steps (at most limit) only decode deferred rows, with nothing
        happening but new KV blocks before the last (DeferredDecodes.quiet_steps); 0 while any
        request waits."""
        if self.deferred is None or self.waiting:
            return 0
        return self.deferred.quiet_steps(limit, self.block_manager.num_free_blocks)

    def finish_deferred(self, finished: list[Request], now: float) -> None:
        """Finish the deferred rows a quiet step (sim.replay.coast) that ended at `now` brought to
        max_new_tokens (DeferredDecodes.update returned them), as update would."""
        for request in finished:
            self._finish(request, FinishReason.LENGTH, now)
            self.running.remove(request)
