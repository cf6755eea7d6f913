"""One Scheduler, composed from parts: a waiting queue, a batching policy, an eviction mechanism.

There is no prefill phase or decode phase: each request has `num_computed_tokens`, and each
step hands out tokens from one budget so every running request catches up with its sequence.
A request samples a token in the step that completes its sequence, so a newly admitted one
gets its first token from prefill and the running ones advance exactly one token per step.
The waiting queue (sim.engine.queues) orders admissions and names eviction victims, the batching
policy (sim.engine.batching, sim.engine.scheduler_config) plans each step through the steps
offered here, the eviction mechanism (sim.engine.eviction) decides what becomes of a victim's KV,
and, for a replay priced by a cost model, a decode fast-forward (sim.engine.fast_forward) keeps
the decode rows out of the plans.
"""

from __future__ import annotations

from sim.engine.batch_plan import add_running, add_to_plan, remove_from_plan
from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, FinishReason, Request, RequestStatus, StepResult
from sim.engine.eviction import EVICTIONS
from sim.engine.fast_forward import DecodeFastForward
from sim.engine.queues import make_queue
from sim.engine.scheduler_config import BATCHING, SchedulerConfig
from sim.engine.speculation.planning import add_running_speculative
from sim.engine.speculation.speculator import Speculator

# An Enum member looked up on its class costs ~0.1 us, as much as the rest of a row's work
# in a per-row loop, which therefore compares against this module constant.
_RUNNING = RequestStatus.RUNNING


class Scheduler:
    """Owns the waiting and running queues and the KV block manager."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.block_manager = BlockManager(config.num_blocks, config.block_size,
                                          config.enable_prefix_caching, config.num_host_blocks)
        # In --queue order (sim.engine.queues); preempted requests go back to the front.
        self.waiting = make_queue(config.queue, config.aging_s, config.sjf_noise)
        self.batching = BATCHING[config.policy]()
        self.eviction = EVICTIONS[config.preemption](self.block_manager)
        # The parts' per-step methods, bound once (each is called every step); the optional
        # ones are None where a part has nothing to do.
        self._before_step, self._plan_step = self.eviction.before_step, self.batching.schedule
        self._charge, self._hold = self.waiting.charge_step, self.batching.hold
        self._returned = self.batching.returned
        # In the order the waiting queue keeps it (admission order, or priority then
        # admission): the queue names eviction victims from it.
        self.running: list[Request] = []
        self.num_preemptions = 0
        # Prefix cache lookups at admission, in tokens, as vLLM counts them: every admission
        # (a recompute after preemption too) queries its whole sequence.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self._caching = config.enable_prefix_caching
        self._live: dict[str, Request] = {}  # unfinished requests by id
        self._budget = config.budget
        # Keeps decode rows out of the plans (start_fast_forward); None: every row is listed.
        self.fast_forward: DecodeFastForward | None = None
        # A P/D prefill engine keeps a finished request's KV until its transfer is done
        # (release_kv), as vLLM's P/D connectors free a block only once it has been sent.
        self.keep_finished_kv = False
        # Proposals for decoding rows and their acceptance (sim.engine.speculation); None: off.
        self.speculator = Speculator(config.speculative) if config.speculative else None

    @property
    def num_swapped_out(self) -> int:
        """Preemptions that kept the victim's KV in host memory (--preemption swap)."""
        return self.eviction.num_swapped_out

    @property
    def max_num_seqs(self) -> int:
        """Most requests running at once."""
        return self.config.max_num_seqs

    @property
    def held_rows(self) -> list[Request]:
        """Finished requests that still hold KV in the batch (static batching's padding)."""
        return self.batching.held_rows

    # ---- requests in and out -------------------------------------------------------------

    def add(self, request: Request) -> bool:
        """Queue a request; reject it at once (and return False) if it can never fit."""
        if request.request_id in self._live:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        reason = self.config.never_fits(request.prompt_len + request.max_new_tokens)
        if reason:
            request.status = RequestStatus.FINISHED
            request.finish_reason = FinishReason.REJECTED
            request.finish_detail = reason
            request.finish_s = request.arrival_s
            return False
        request.status = RequestStatus.WAITING
        self._live[request.request_id] = request
        self.waiting.append(request)
        return True

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORTED,
              now: float | None = None) -> Request | None:
        """Finish a live request early and free its KV at once; None if it is not live."""
        request = self._live.get(request_id)
        if request is None:
            return None
        now = now if now is not None else request.arrival_s
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            if self.batching.hold(request, reason):  # like any finished row of its batch
                del self._live[request_id]
                request.finish_s = now
                return request
        else:
            self.waiting.remove(request)
            if self.block_manager.holds_swapped(request_id):
                self.block_manager.drop_swapped(request_id)
        self._finish(request, reason, now)
        return request

    @property
    def has_unfinished(self) -> bool:
        return bool(self._live)

    def start_fast_forward(self) -> bool:
        """Keep decode rows out of the plans' row lists from now on (sim.engine.fast_forward):
        for a backend that prices a plan from its totals and samples no tokens. Returns
        whether it does: not when a part does per-row work it does not model (static
        batching's padding, swap's copies, a fair queue's charges, speculation's
        proposals)."""
        if self._live:
            raise RuntimeError("start_fast_forward must come before the first request")
        if (self.batching.allows_fast_forward and self.eviction.allows_fast_forward
                and self.waiting.allows_fast_forward and self.speculator is None):
            self.fast_forward = DecodeFastForward(
                self.block_manager, not self.batching.reserves_full, self.waiting.sorts_running)
        return self.fast_forward is not None

    def finish_at_length(self, finished: list[Request], now: float) -> None:
        """Finish the requests a fast-forwarded step that ended at `now` brought to
        max_new_tokens (DecodeFastForward.update returned them), as update would."""
        for request in finished:
            self._finish(request, FinishReason.LENGTH, now)
            self.running.remove(request)

    # ---- one step ------------------------------------------------------------------------

    def schedule(self, now: float) -> BatchPlan:
        """Decide what the next step computes (an empty plan if there is nothing to do)."""
        plan = BatchPlan()
        if self._before_step is not None:
            self._before_step()
        self._plan_step(self, plan, now)
        return plan

    def schedule_running(self, plan: BatchPlan, on_demand: bool) -> int:
        """Schedule the running requests from the step's token budget, in running order
        (sim.engine.batch_plan.add_running); on_demand: find KV as sequences grow, evicting when the
        pool is short. Returns the budget left."""
        make_room = self._make_room if on_demand else None
        if self.speculator is not None:
            return add_running_speculative(plan, self.running, self._budget, make_room,
                                           self.speculator)
        if self.fast_forward is not None:
            return self.fast_forward.schedule_running(plan, self._budget, self._make_room,
                                                      make_room)
        return add_running(plan, self.running, self._budget, make_room,
                           self.block_manager.block_size)

    def _make_room(self, request: Request, num_tokens: int, plan: BatchPlan) -> bool:
        """Allocate KV up to num_tokens, evicting the running requests the waiting queue
        would serve last if needed. Returns False when `request` itself was evicted."""
        try_allocate = self.block_manager.try_allocate
        rid = request.request_id
        victim_of = self.waiting.victim
        while not try_allocate(rid, num_tokens):
            victim = victim_of(self.running)
            self._preempt(victim, plan)
            if victim is request:
                return False
        return True

    def _preempt(self, victim: Request, plan: BatchPlan) -> None:
        """Evict a running request: the eviction mechanism keeps or drops its KV; either way
        it goes back to the front of the queue."""
        running = self.running
        if running[-1] is victim:
            running.pop()
        else:
            running.remove(victim)
        if self.fast_forward is not None:  # a row catches up (and leaves this step's totals)
            self.fast_forward.leave(victim, plan)
        n = plan.num_scheduled_tokens.pop(victim.request_id, None)
        if n is not None:  # it was scheduled earlier in this step: take it back out
            plan.requests.remove(victim)
            remove_from_plan(plan, victim, n)
        self.eviction.evict(victim, plan)
        victim.status = RequestStatus.PREEMPTED
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        plan.preempted.append(victim.request_id)

    def admit(self, plan: BatchPlan, budget: int, now: float, reserve: bool,
              split: bool) -> None:
        """Move waiting requests to running in queue order while slots, budget and KV allow
        (reserve: KV for prompt + max_new_tokens up front; split: the last admitted may get
        a partial chunk of its prompt)."""
        bm, eviction = self.block_manager, self.eviction
        waiting = self.waiting
        max_seqs = self.config.max_num_seqs
        while waiting and budget > 0:
            request = waiting.head(now)
            if len(self.running) >= max_seqs and not self._preempt_for(request, plan, now):
                break
            swapped = eviction.holds(request)
            prefix = bm.cached_prefix(request) if self._caching and not swapped else ()
            hit = len(prefix) * bm.block_size
            cached = (request.num_computed_tokens if swapped
                      else max(hit, request.num_external_tokens))
            n = request.num_tokens - cached
            if n > budget:
                if not split:
                    break  # the head waits for a step with room for its whole prompt
                n = budget
            need = request.prompt_len + request.max_new_tokens if reserve else cached + n
            # A held request's KV comes back from host memory before this step's forward.
            if not (eviction.restore(request, need, plan) if swapped
                    else bm.try_allocate(request.request_id, need, prefix)):
                if self._preempt_for(request, plan, now):
                    continue
                break
            waiting.take(request)
            self.start(request, plan, now, cached, hit)
            add_to_plan(plan, request, n)
            budget -= n

    def start(self, request: Request, plan: BatchPlan, now: float, cached: int,
               hit: int) -> None:
        """Running from now with the KV of its first `cached` tokens: `hit` of them found in
        the prefix cache, the rest handed over from outside (num_external_tokens)."""
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = cached
        if self._caching:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += hit
            if request.num_external_tokens > hit:  # as vLLM caches what a KV connector loaded
                self.block_manager.cache_blocks(request, cached)
        request.num_external_tokens = 0  # a recompute after preemption starts from its own
        if request.first_scheduled_s is None:
            request.first_scheduled_s = now
            request.num_cached_tokens = hit
        self.waiting.place(self.running, request)
        if self.fast_forward is not None:
            self.fast_forward.started(request)
        plan.admitted.append(request.request_id)

    def _preempt_for(self, request: Request, plan: BatchPlan, now: float) -> bool:
        """Evict the running request the queue would serve last to make room for a waiting
        one, where the queue allows it (under `priority`: a strictly higher class); False
        (nothing done) otherwise. Neither a request admitted this step (it would be admitted
        and evicted over and over) nor an overdue one (a stream of higher classes would
        evict it forever) is evicted."""
        running = self.running
        if not running:
            return False
        victim = self.waiting.victim(running)
        if (not self.waiting.preempts(request, victim) or victim.request_id in plan.admitted
                or now - victim.arrival_s >= self.config.aging_s):
            return False
        self._preempt(victim, plan)
        return True

    # ---- after the step ------------------------------------------------------------------

    def update(self, plan: BatchPlan, result: StepResult, now: float) -> list[Request]:
        """Apply a finished step at time `now`: new tokens, retirements. Returns finished."""
        sampled = result.sampled_token_ids
        finished: list[Request] = []
        hold = self._hold
        block_size = self.block_manager.block_size
        cache_blocks = self.block_manager.cache_blocks if self._caching else None
        fast_forward = self.fast_forward
        if fast_forward is not None:  # its rows come first, as decodes do in a plan
            finished = self._update_fast_forward(sampled, now)
        self._before_tokens(plan, result, now)
        # plan.requests and num_scheduled_tokens share one order (eviction removes from both).
        for request, n in zip(plan.requests, plan.num_scheduled_tokens.values(), strict=True):
            computed = request.num_computed_tokens + n
            request.num_computed_tokens = computed
            if cache_blocks and computed // block_size != (computed - n) // block_size:
                cache_blocks(request, computed)  # blocks filled this step join the cache
            times = request.token_times_s
            num_tokens = request.prompt_len + len(times)  # (Request.num_tokens, inlined)
            if computed != num_tokens:  # a prefill chunk that did not reach the end of the sequence
                continue
            times.append(now)
            reason = None if sampled is None else _append_sampled(request, sampled)
            if reason is None:
                if len(times) < request.max_new_tokens:
                    continue
                reason = FinishReason.LENGTH
            finished.append(request)
            if hold(request, reason):  # it stays in the batch (static batching's padding)
                del self._live[request.request_id]
            else:
                self._finish(request, reason, now)
        if finished:
            self.running = [r for r in self.running if r.status is _RUNNING]
        if plan.num_spec_tokens and not self.batching.reserves_full:
            self.speculator.release_lookahead(plan, self.block_manager)
        if fast_forward is not None:  # the listed requests that decode from now on
            fast_forward.adopt(plan.requests)
        returned = self._returned
        return finished if returned is None else returned(self, finished, now)

    def _before_tokens(self, plan: BatchPlan, result: StepResult, now: float) -> None:
        """What comes before a step's tokens are applied: service counted (a fair queue
        keeps it), verified rows' accepted proposals in and rejected ones rolled back."""
        if self._charge is not None:
            self._charge(plan)
        if plan.num_spec_tokens:
            self.speculator.settle(plan, result, now)

    def _update_fast_forward(self, sampled: dict[str, int] | None, now: float) -> list[Request]:
        """Apply the step that ended at `now` to the fast-forwarded rows; those it finished."""
        if sampled is not None:
            raise RuntimeError("a decode fast-forward needs a backend that samples no tokens")
        finished = self.fast_forward.update(now)
        for request in finished:
            self._finish(request, FinishReason.LENGTH, now)
        return finished

    def _finish(self, request: Request, reason: FinishReason, now: float) -> None:
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_s = now
        self._live.pop(request.request_id, None)
        self.waiting.forget(request)
        if self.fast_forward is not None:
            self.fast_forward.leave(request)
        if self.block_manager.holds(request.request_id) and not (
                self.keep_finished_kv and reason in (FinishReason.LENGTH, FinishReason.STOP)):
            self.block_manager.free(request.request_id)

    def release_kv(self, request_id: str) -> None:
        """Free the KV a finished request kept (keep_finished_kv): it has been sent."""
        if request_id not in self._live and self.block_manager.holds(request_id):
            self.block_manager.free(request_id)


def _append_sampled(request: Request, sampled: dict[str, int]) -> FinishReason | None:
    """Append the token the step sampled for request; STOP if it ends the sequence."""
    token = sampled[request.request_id]
    request.output_token_ids.append(token)
    return FinishReason.STOP if request.sampling.stops(token) else None
