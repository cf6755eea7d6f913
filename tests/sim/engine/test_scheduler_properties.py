"""Property-based invariants: budgets, slots, block conservation, completion under pressure."""

from __future__ import annotations

import numpy as np
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from sim.cost.fixed_backend import ConstantBackend
from sim.engine.core import FinishReason, Request, StepResult
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import POLICIES, QUEUES, SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace


def check_blocks(sched: Scheduler) -> None:
    """Every block is free, cached-free or held, once; reference counts match the tables."""
    bm = sched.block_manager
    bm.check()
    holders = sched.running + sched.held_rows  # static padding rows keep KV until batch end
    assert set(bm._tables) <= {r.request_id for r in holders}


class KVContent:
    """The test's own record of which token each KV slot holds, written as steps compute."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.slots: dict[tuple[int, int], int] = {}  # (block, offset) -> token id
        self.host: dict[tuple[int, int], int] = {}  # swapped-out KV: (host block, offset)

    def write(self, sched: Scheduler, plan) -> None:
        bs = self.block_size
        for source, target, copies in ((self.slots, self.host, plan.swap_out),
                                       (self.host, self.slots, plan.swap_in)):
            for _, blocks_from, blocks_to in copies:  # what the executor copies first
                for a, b in zip(blocks_from, blocks_to, strict=True):
                    for offset in range(bs):
                        if (a, offset) in source:
                            target[b, offset] = source[a, offset]
        for request, n in zip(plan.requests, plan.num_scheduled_tokens.values(), strict=True):
            table = sched.block_manager.block_table(request.request_id)
            tokens = request.token_ids()
            for pos in range(request.num_computed_tokens, request.num_computed_tokens + n):
                self.slots[table[pos // bs], pos % bs] = tokens[pos]

    def check(self, sched: Scheduler) -> None:
        """Every computed token of every running request reads its own token's KV."""
        bs = self.block_size
        for request in sched.running:
            table = sched.block_manager.block_table(request.request_id)
            tokens = request.token_ids()
            for pos in range(request.num_computed_tokens):
                assert self.slots.get((table[pos // bs], pos % bs)) == tokens[pos], (
                    f"request {request.request_id} reads wrong KV at position {pos}")


# Prompts are drawn from a few shared stems so that prefix-cache hits are frequent.
STEMS = [[7] * 64, [7] * 8 + [3] * 56, list(range(10, 74))]


def prompt_tokens(stem: int, length: int, salt: int) -> list[int]:
    tokens = STEMS[stem][:length]
    return tokens + [100 + (salt * 31 + i) % 50 for i in range(length - len(tokens))]


def sampled(plan) -> dict[str, int]:
    """A fixed next token per (request, position): what a greedy model would produce."""
    return {r.request_id: 200 + (len(r.request_id) * 7 + r.num_tokens) % 3
            for r, n in zip(plan.requests, plan.num_scheduled_tokens.values(), strict=True)
            if r.num_computed_tokens + n == r.num_tokens}


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 120), st.integers(1, 40), st.integers(0, 2)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
        st.tuples(st.just("step"), st.integers(1, 4)),
    ),
    min_size=1,
    max_size=60,
)


# Many requests on few shared stems in a small pool: hits, evictions and preemptions mix.
shared_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(20, 120), st.integers(1, 30), st.integers(0, 2)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
        st.tuples(st.just("step"), st.integers(1, 8)),
    ),
    min_size=10,
    max_size=60,
).filter(lambda operations: sum(op[0] == "add" for op in operations) >= 4)


@settings(max_examples=80, deadline=None)
@given(policy=st.sampled_from(POLICIES), operations=ops, num_blocks=st.integers(4, 40),
       max_num_seqs=st.integers(1, 6), caching=st.booleans())
def test_blocks_conserved_and_limits_hold_under_random_arrivals_aborts_preemptions(
    policy, operations, num_blocks, max_num_seqs, caching
):
    exercise(policy, operations, num_blocks, max_num_seqs, caching)


@settings(max_examples=60, deadline=None)
@given(policy=st.sampled_from(POLICIES), operations=shared_ops,
       num_blocks=st.integers(31, 60), max_num_seqs=st.integers(2, 6))
def test_prefix_cache_hits_read_their_own_tokens_and_conserve_blocks(
    policy, operations, num_blocks, max_num_seqs
):
    exercise(policy, operations, num_blocks, max_num_seqs, caching=True)


@settings(max_examples=60, deadline=None)
# An overdue low-priority request admitted and evicted for a higher one in the same step,
# over and over (a livelock); a request swapped in and evicted again in one step.
@example(policy="recompute", operations=[("add", 20, 1, 0)] * 10 + [
    ("add", 105, 1, 1), ("step", 1), ("add", 20, 1, 0)], num_blocks=31, max_num_seqs=2,
    caching=False, queue="priority", swap_blocks=1)
@example(policy="recompute", operations=[
    ("add", 20, 1, 0), ("abort", 0), ("abort", 0), ("add", 87, 8, 0), ("abort", 0),
    ("step", 1), ("step", 1), ("add", 20, 3, 1), ("step", 1), ("add", 26, 4, 0)],
    num_blocks=31, max_num_seqs=2, caching=False, queue="priority", swap_blocks=5)
@given(policy=st.sampled_from(["recompute", "chunked"]), operations=shared_ops,
       num_blocks=st.integers(31, 45), max_num_seqs=st.integers(2, 6), caching=st.booleans(),
       queue=st.sampled_from(QUEUES), swap_blocks=st.integers(1, 30))
def test_swap_and_queue_orders_keep_kv_and_blocks_right(
    policy, operations, num_blocks, max_num_seqs, caching, queue, swap_blocks
):
    exercise(policy, operations, num_blocks, max_num_seqs, caching, queue=queue,
             queue_aging_s=0.05, preemption="swap", swap_space_blocks=swap_blocks)


def exercise(policy: str, operations: list, num_blocks: int, max_num_seqs: int,
             caching: bool, **config) -> None:
    """Apply the operations, then step until done, checking every invariant after each step."""
    budget = None if policy in ("static", "continuous", "recompute") else 8 * max_num_seqs
    cfg = SchedulerConfig(policy=policy, num_blocks=num_blocks, block_size=4,
                          max_num_seqs=max_num_seqs, max_model_len=160, token_budget=budget,
                          enable_prefix_caching=caching, **config)
    sched = Scheduler(cfg)
    content = KVContent(cfg.block_size)
    added: list[Request] = []
    now = 0.0
    for op in operations + [("step", 400)]:
        if op[0] == "add":
            tokens = prompt_tokens(op[3], op[1], len(added))
            request = Request(str(len(added)), now, op[1], op[2], prompt_token_ids=tokens,
                              priority=op[3], tenant=f"t{op[3]}")
            sched.add(request)
            added.append(request)
        elif op[0] == "abort" and added:
            sched.abort(added[op[1] % len(added)].request_id, now=now)
        elif op[0] == "step":
            now = step_checked(sched, content, op[1], now)
    check_drained(sched, added, caching)


def step_checked(sched: Scheduler, content: KVContent, steps: int, now: float) -> float:
    """Up to `steps` steps (until one plans nothing), every invariant checked after each;
    returns the clock after them."""
    cfg = sched.config
    for _ in range(steps):
        plan = sched.schedule(now)
        if plan.is_empty:
            break
        assert len(plan.requests) <= cfg.max_num_seqs
        if cfg.policy != "static":
            assert sum(plan.num_scheduled_tokens.values()) <= cfg.budget
        # Decoders: running requests whose whole sequence is in cache but the last token.
        before = {r.request_id: r.num_output_tokens for r in sched.running
                  if r.num_tokens - r.num_computed_tokens == 1}
        content.write(sched, plan)
        now += 0.01
        sched.update(plan, StepResult(0.01, sampled(plan)), now)
        for r in plan.requests:  # a scheduled decoder advances by exactly one token
            if r.request_id in before:
                assert r.num_output_tokens == before[r.request_id] + 1
        check_blocks(sched)
        content.check(sched)
    return now


def check_drained(sched: Scheduler, added: list[Request], caching: bool) -> None:
    """Everything finished, every block back in the pool, the counters consistent."""
    assert not sched.has_unfinished
    assert sched.block_manager.num_free_blocks == sched.config.num_blocks
    assert not sched.block_manager._tables
    sched.block_manager.check()
    event(f"prefix cache hits: {sched.prefix_cache_hits > 0}, preemptions: "
          f"{sched.num_preemptions > 0}, swaps: {sched.num_swapped_out > 0}")
    if not caching:
        assert sched.prefix_cache_hits == 0 and sched.block_manager.num_cached_blocks == 0
    for request in added:
        assert request.is_finished
        assert 0 <= request.num_cached_tokens < max(request.prompt_len, 1) or (
            request.first_scheduled_s is None)
        if request.finish_reason is FinishReason.LENGTH:
            assert request.num_output_tokens == request.max_new_tokens


def poisson_requests(n: int, rate: float, prompt: tuple[int, int], out: tuple[int, int],
                     seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    prompts = rng.integers(*prompt, n)
    outs = rng.integers(*out, n)
    return [Request(str(i), float(arrivals[i]), int(prompts[i]), int(outs[i])) for i in range(n)]


def test_every_request_completes_with_pool_far_smaller_than_demand():
    for policy in ("recompute", "chunked"):
        requests = poisson_requests(300, 50.0, (50, 400), (20, 200))
        demand = sum(-(-(r.prompt_len + r.max_new_tokens) // 16) for r in requests)
        cfg = SchedulerConfig(policy=policy, num_blocks=40, max_model_len=640, max_num_seqs=32)
        assert cfg.num_blocks * 20 < demand
        result = run_trace(requests, Engine(Scheduler(cfg), ConstantBackend(0.01, 1e-5)))
        assert all(r.finish_reason is FinishReason.LENGTH for r in result.requests)
        assert all(r.num_output_tokens == r.max_new_tokens for r in result.requests)
        assert result.num_preemptions > 0, policy


def test_simulator_matches_mm1_mean_sojourn_time():
    """One request at a time, one-step service with exponential time: W = 1 / (mu - lambda)."""

    class ExponentialBackend:
        def __init__(self, mean_s: float, seed: int) -> None:
            self.mean_s = mean_s
            self.rng = np.random.default_rng(seed)

        def execute(self, plan):
            return StepResult(float(self.rng.exponential(self.mean_s)))

        def free(self, request):
            pass

    lam, mu = 0.6, 1.0
    requests = poisson_requests(40_000, lam, (8, 9), (1, 2), seed=1)
    cfg = SchedulerConfig(policy="continuous", max_num_seqs=1, num_blocks=64)
    result = run_trace(requests, Engine(Scheduler(cfg), ExponentialBackend(1 / mu, seed=2)))
    sojourn = np.mean([r.token_times_s[0] - r.arrival_s for r in result.requests])
    expected = 1 / (mu - lam)
    assert abs(sojourn - expected) / expected < 0.05
