"""A Backend that stands in for a GPU, and the tokens it emits.

`servelab serve --simulate` runs the real scheduler and HTTP server on this backend: a cost
model prices each step and the wall clock paces it, so the server behaves like a deployment
of any size the cost model describes, with no weights.

Clients such as aiperf count output tokens by encoding the text they received. A run of
one token ("xxxx") merges under a BPE tokenizer, so they would count 2 tokens where the
server sent 128. The token pool holds ids that survive decode-then-encode next to each other
(whole words between the pre-tokenizer's splits, or single bytes), checked on a drawn
sequence, and each request draws from it by its seed.

With `--speculative-config`, a decoding row verifies k proposals and keeps as many as the
configured acceptance rates draw, exactly as `servelab simulate` prices it; the tokens a
row gains are the ones it would have drawn one step at a time, so speculation changes when
tokens arrive, never which.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from servelab.serve.tokenizer import Tokenizer
from sim.engine.core import Backend, BatchPlan, Request, StepResult, token_seed
from sim.engine.scheduler import Scheduler
from sim.engine.speculation.config import SpeculativeConfig
from sim.engine.speculation.speculator import Draft, Speculator

Acceptance = Callable[[Request, int], int]  # (row, proposals) -> proposals accepted

POOL_SIZE = 512  # ids kept: plenty of variety, and a start-up check of milliseconds
MAX_SCANNED = 20_000  # candidates tried before giving up on filling the pool
CHECK_TOKENS = 256  # length of the drawn sequence the whole pool is checked with
CONTEXT = 8  # accepted ids a candidate is tried next to


class NoRoundTripTokens(ValueError):
    """The tokenizer has no ids whose text re-encodes to themselves."""


def round_trip_token_ids(tokenizer: Tokenizer, size: int = POOL_SIZE) -> tuple[int, ...]:
    """Up to `size` ids (sorted) that any sequence drawn from them re-encodes to itself.

    Whole words first: ids whose text is letters that the decoder separates from the next
    id by a space (" holders", or a word-level tokenizer's "hello"), so every pre-tokenizer
    that splits at spaces encodes each on its own. A tokenizer with none (byte-level,
    without merges) gets any printable id that keeps itself next to its neighbours.
    """
    for is_word in (True, False):
        pool = _scan(tokenizer, size, is_word)
        sample = [draw_token(pool, 0, index) for index in range(CHECK_TOKENS)] if pool else []
        if pool and _round_trips(tokenizer, sample):
            return pool
    raise NoRoundTripTokens(f"tokenizer {tokenizer.name}: no set of tokens whose text "
                            "re-encodes to themselves; cannot draw simulated output")


def _scan(tokenizer: Tokenizer, size: int, is_word: bool) -> tuple[int, ...]:
    """Candidates in a fixed shuffled order, each kept if it round-trips after the last
    CONTEXT kept ones (and, for words, is one)."""
    order = np.random.default_rng(0).permutation(tokenizer.vocab_size)[:MAX_SCANNED]
    pool: list[int] = []
    for token in order.tolist():
        if (not is_word or _is_word(tokenizer, token)) and \
                _keeps_itself(tokenizer, pool[-CONTEXT:], token):
            pool.append(token)
            if len(pool) == size:
                break
    return tuple(sorted(pool))


def _is_word(tokenizer: Tokenizer, token: int) -> bool:
    """ASCII letters whose repeat the decoder writes with a space between ("a a")."""
    first, *rest = tokenizer.decode([token, token]).strip().split(" ")
    return rest == [first] and first.isascii() and first.isalpha()


def _keeps_itself(tokenizer: Tokenizer, context: list[int], token: int) -> bool:
    """Whether token is printable text, no special token, and round-trips twice in a row
    after the context (a run of it must not merge, nor it with its neighbours)."""
    if token == tokenizer.eos_token_id:
        return False
    text = tokenizer.decode([token])
    if not text.strip() or not text.isprintable() or "\ufffd" in text:
        return False
    return _round_trips(tokenizer, [*context, token, token])


def _round_trips(tokenizer: Tokenizer, token_ids: list[int]) -> bool:
    text = tokenizer.decode(token_ids)
    return tokenizer.encode(text, add_special_tokens=False) == token_ids


def draw_token(pool: Sequence[int], seed: int, index: int) -> int:
    """Output token `index` of a request seeded `seed`: the same whatever the batch."""
    return pool[token_seed(seed, index) % len(pool)]


class SimulatedBackend:
    """Each step takes the cost model's duration of wall-clock time and draws from `pool`.

    A sampled token is drawn from the pool (round_trip_token_ids) by the request's
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
                 clock: Callable[[], float] = time.perf_counter,
                 acceptance: Acceptance | None = None) -> None:
        self.cost = cost
        if not pool:
            raise ValueError("SimulatedBackend: the token pool is empty")
        self.pool = pool
        # Speculation: how many of a verifying row's proposals the target "accepts" (the
        # scheduler's speculator draws it from acceptance_rates); None: speculation is off.
        self._acceptance = acceptance
        self._sleep = sleep
        self._clock = clock
        self._due_s: float | None = None  # clock() at which the previous step was due to end

    def execute(self, plan: BatchPlan) -> StepResult:
        """Sleep until the step's predicted end; the sampled tokens and the wall time taken."""
        start_s = self._clock()
        duration_s = self.cost.execute(plan).duration_s
        sampled = sampled_token_ids(plan, self.pool)
        verified = self._verified(plan) if plan.num_spec_tokens else None
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
        return StepResult(self._clock() - start_s, sampled, verified)

    def _verified(self, plan: BatchPlan) -> dict[str, list[int]]:
        """Each verifying row's tokens: its accepted proposals and the token after them, the
        1 + a tokens it draws next (a from the acceptance rates)."""
        if self._acceptance is None:
            raise ValueError("SimulatedBackend: a plan verifies proposals but no acceptance "
                             "was configured")
        verified = {}
        for request in plan.requests:
            k = plan.num_spec_tokens.get(request.request_id)
            if k is None:
                continue
            index, seed = len(request.output_token_ids), request.sampling.seed
            verified[request.request_id] = [
                draw_token(self.pool, seed, index + i)
                for i in range(self._acceptance(request, k) + 1)]
        return verified

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


class DrawnSpeculator(Speculator):
    """The simulated server's speculation: every decoding row proposes k tokens and the
    acceptance rates decide how many are accepted, as in `servelab simulate`.

    The simulated server's text is drawn at random, so an n-gram lookup over it would say
    nothing about a real deployment's acceptance; the configured rates (per decoding row, as
    `simulate` reads them) stand in for it."""

    def __init__(self, config: SpeculativeConfig) -> None:
        if config.method != "ngram":
            raise ValueError(f"speculative method {config.method!r}: its drafter's forward "
                             "passes are not priced yet; simulate ngram")
        if not config.acceptance_rates:
            raise ValueError("serve --simulate with --speculative-config needs "
                             "acceptance_rates (no model verifies the proposals)")
        super().__init__(config)

    def propose(self, request: Request, limit: int) -> Draft:
        """k proposals (at most `limit`), no ids: the backend draws the tokens."""
        k = min(self.config.num_speculative_tokens, limit)
        return Draft(max(k, 0), ())


def simulate_speculation(scheduler: Scheduler) -> Acceptance | None:
    """Give the scheduler a DrawnSpeculator when speculation is on; the acceptance its
    SimulatedBackend draws with (None: off)."""
    config = scheduler.config.speculative
    if config is None:
        return None
    scheduler.speculator = DrawnSpeculator(config)
    return scheduler.speculator.draw_accepted
