"""Profile the executor's step time over a grid of batch shapes, for the calibrated cost model.

Grid: prefill chunks x context lengths, decode batch sizes x context spreads, mixed batches
(a chunk riding with decodes), ragged steps (prompt bursts with decodes), static batches
mostly made of padding rows and, for speculative decoding, rows verifying proposals (alone,
with decodes, or with prompts admitted beside them). Each point is a BatchPlan built the
scheduler's way (sim.engine.batch_plan) over requests whose KV blocks are allocated, run
several times through ModelBackend.execute, in rounds over the grid; the median measured
duration is the point's step time, and the runs' spread around it the calibration's step
jitter.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from executor.backend import ModelBackend
from executor.native import ROW_KNOTS
from sim.engine.batch_plan import add_padding, add_to_plan, add_verify
from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, Request

# A sequence's share of a profiled step: (tokens already in KV, tokens computed now).
Share = tuple[int, int]


@dataclass(frozen=True)
class ProfilePoint:
    """One batch shape: its kind (for reports) and every sequence's share."""

    kind: str  # "prefill", "decode", "mixed", "static" or "verify"
    shares: tuple[Share, ...]
    # Static batching's finished rows, computed as padding: each one's KV length.
    padding: tuple[int, ...] = ()
    # Speculative decoding: per share, the proposals its row verifies (its n tokens are its
    # last token and those n - 1 proposals, with logits at every one); 0 for a share that
    # does not verify. Empty: no row verifies.
    proposals: tuple[int, ...] = ()

    @classmethod
    def from_plan(cls, plan: BatchPlan) -> ProfilePoint:
        """The shape of a step a run scheduled (read before the engine applies it)."""
        spec = plan.num_spec_tokens
        kind = ("static" if plan.padding else "verify" if spec
                else "prefill" if not plan.decode_seqs
                else "mixed" if plan.prefill_tokens else "decode")
        shares = tuple((r.num_computed_tokens, plan.num_scheduled_tokens[r.request_id])
                       for r in plan.requests)
        proposals = tuple(spec.get(r.request_id, 0) for r in plan.requests) if spec else ()
        return cls(kind, shares, tuple(r.num_tokens for r in plan.padding), proposals)

    @property
    def kv_tokens(self) -> int:
        return sum(start + n for start, n in self.shares) + sum(self.padding)

    @property
    def seqs(self) -> int:
        """Sequences in the step, padding rows included."""
        return len(self.shares) + len(self.padding)

    @property
    def rows(self) -> int:
        """Rows the step computes: chunk tokens, decodes and padding."""
        return sum(n for _, n in self.shares) + len(self.padding)

    @property
    def longest(self) -> int:
        return max([s + n for s, n in self.shares] + list(self.padding))

    def blocks(self, block_manager: BlockManager) -> int:
        """KV blocks the step's sequences and padding rows hold in that pool."""
        lengths = [start + n for start, n in self.shares] + list(self.padding)
        return sum(block_manager.blocks_for(length) for length in lengths)


def profile_grid(max_model_len: int, max_kv_tokens: int, quick: bool = False,
                 speculative: bool = False, max_num_seqs: int | None = None
                 ) -> list[ProfilePoint]:
    """The profiled shapes, capped by the model length, the KV pool and, if given, the
    scheduler's max_num_seqs (it makes no step of more sequences, and a linear fit pulled by
    such steps misprices the ones it makes); with `speculative`, the steps of speculative
    decoding too (_verify_steps)."""
    chunks = (8, 32, 128, 512) if quick else (4, 16, 64, 128, 256, 512, 1024)
    contexts = (0, 512) if quick else (0, 256, 1024, 1536)
    batches = (1, 4, 16, 64) if quick else (1, 2, 4, 8, 16, 32, 64, 128, 256)
    lengths = (64, 1024) if quick else (32, 256, 1024, 1792)
    points = [ProfilePoint("prefill", ((c, n),)) for n in chunks for c in contexts]
    points += [ProfilePoint("prefill", tuple((0, n) for _ in range(4))) for n in chunks[:-1]]
    # Decodes at every row count the cost model has a knot at, as well (ROW_KNOTS).
    for b in sorted(set(batches) | set(ROW_KNOTS)):
        for length in lengths:
            points.append(ProfilePoint("decode", tuple((length, 1) for _ in range(b))))
            # Spread: one long context among short ones (a padded kernel pays for the long one).
            spread = ((length, 1),) + tuple((max(8, length // 16), 1) for _ in range(b - 1))
            points.append(ProfilePoint("decode", spread))
    for b in batches[1:]:
        for n in chunks[1::2]:
            shares = ((256, n),) + tuple((lengths[1], 1) for _ in range(b))
            points.append(ProfilePoint("mixed", shares))
    points += _ragged_steps(quick)
    # Static batches late in life: a few rows still decoding, the rest finished and computed
    # as padding (no logits), the steps that tell a sampled row's cost from a computed one's.
    for b in batches[2::2]:
        for length in lengths[:1] if quick else lengths[1:3]:
            live = max(1, b // 8)
            points.append(_static(live, b - live, length))
    # And at every knot of live rows, under 12 and 48 rows in all: the lm_head's cost climbs
    # its own staircase in the rows with logits, apart from the layers' in computed rows.
    for b in (12, 48):
        points += [_static(live, b - live, lengths[1]) for live in ROW_KNOTS if live < b]
    if speculative:
        points += _verify_steps((1, 8) if quick else (1, 2, 4, 8, 16, 32, 64),
                                (64,) if quick else (32, 256, 1024))
        points += _admissions_beside_verify((4,) if quick else (4, 16))
    return [p for p in points if p.longest < max_model_len and p.kv_tokens <= max_kv_tokens
            and (max_num_seqs is None or p.seqs <= max_num_seqs)]


def _static(live: int, finished: int, length: int) -> ProfilePoint:
    """A static batch's step: `live` rows decoding, `finished` computed as padding."""
    return ProfilePoint("static", ((length, 1),) * live, (length,) * finished)


def _ragged_steps(quick: bool) -> list[ProfilePoint]:
    """Steps as traces make them: a burst of whole prompts of spread lengths (lognormal,
    median 128) with decodes of spread contexts (median 256) riding along. A fixed seed, so
    every machine profiles the same shapes."""
    rng = np.random.default_rng(0)
    points = []
    for prompts in ((2, 8) if quick else (2, 4, 8, 16)):
        for riders in ((0, 16) if quick else (0, 8, 32)):
            lens, ctxs = _prompt_lengths(rng, prompts), _running_contexts(rng, riders)
            shares = tuple((0, n) for n in lens) + tuple((c, 1) for c in ctxs)
            points.append(ProfilePoint("mixed" if riders else "prefill", shares))
    return points


def _verify_steps(rows: tuple[int, ...], contexts: tuple[int, ...]) -> list[ProfilePoint]:
    """Speculative decoding's steps: R rows each verifying k proposals over equal contexts
    (a (k + 1)-token chunk with logits at every position), alone and, up to 16 of them, with
    R more rows decoding one token (rows whose proposer found nothing). The cost model
    prices a verifying row as the chunk it is; without these shapes the fit would price
    short chunks over long contexts from whole prompts (docs/speculative.md)."""
    points = []
    for k in (1, 4):
        for r in rows:
            for context in contexts:
                verifying = ((context, k + 1),) * r
                points.append(ProfilePoint("verify", verifying, proposals=(k,) * r))
                if r <= 16:
                    points.append(ProfilePoint("verify", verifying + ((context, 1),) * r,
                                               proposals=(k,) * r + (0,) * r))
    return points


def _admissions_beside_verify(rows: tuple[int, ...]) -> list[ProfilePoint]:
    """A speculative run's admissions: whole prompts (1 or 4, spread lengths as in
    _ragged_steps) in the step where R running rows verify k proposals over spread contexts.
    Priced from prompt bursts and verify steps apart, such steps of the CPU lab's
    draft-model runs came out 10-30% high (docs/speculative.md). A fixed seed, so every
    machine profiles the same."""
    rng = np.random.default_rng(1)
    points = []
    for prompts in (1, 4):
        lens = _prompt_lengths(rng, prompts)
        for r in rows:
            ctxs = _running_contexts(rng, r)
            for k in (1, 4):
                shares = tuple((0, n) for n in lens) + tuple((c, k + 1) for c in ctxs)
                points.append(ProfilePoint("verify", shares, proposals=(0,) * prompts + (k,) * r))
    return points


def _prompt_lengths(rng: np.random.Generator, n: int) -> list[int]:
    """n whole prompts' lengths as traces spread them: lognormal, median 128, 8-1024."""
    return [int(x) for x in np.clip(rng.lognormal(np.log(128), 0.8, n), 8, 1024).astype(int)]


def _running_contexts(rng: np.random.Generator, n: int) -> list[int]:
    """n running rows' KV lengths: lognormal, median 256, 16-1536."""
    return [int(x) for x in np.clip(rng.lognormal(np.log(256), 0.7, n), 16, 1536).astype(int)]


def point_prompts(point: ProfilePoint, vocab_size: int, rng: np.random.Generator
                  ) -> list[list[int]]:
    """Random token ids for every sequence (and padding row) of the point, whole context."""
    return ([rng.integers(3, vocab_size, start + n).tolist() for start, n in point.shares]
            + [rng.integers(3, vocab_size, length).tolist() for length in point.padding])


def _build_plan(point: ProfilePoint, backend: ModelBackend, prompts: list[list[int]]
                ) -> BatchPlan:
    plan = BatchPlan()
    rows = list(point.shares) + [(length, 0) for length in point.padding]
    proposals = point.proposals
    for i, ((start, n), tokens) in enumerate(zip(rows, prompts, strict=True)):
        k = proposals[i] if i < len(proposals) else 0  # padding rows and plain shapes: 0
        # A verifying row: its sequence ends at its last token; its proposals follow it.
        length = start + n - k
        request = Request(f"profile-{i}", 0.0, length, n if k else 1,
                          prompt_token_ids=tokens[:length])
        request.num_computed_tokens = start
        backend.block_manager.allocate(request.request_id, start + n)
        if k:
            add_verify(plan, request, k, tuple(tokens[length:]))
        elif n:
            add_to_plan(plan, request, n)
        else:
            add_padding(plan, request)
    return plan


def run_point(point: ProfilePoint, backend: ModelBackend, prompts: list[list[int]]
              ) -> tuple[BatchPlan, float]:
    """Run the point's shape once as the profile does (fresh requests, KV blocks allocated
    for the step and freed after it); its plan and measured seconds."""
    plan = _build_plan(point, backend, prompts)
    duration = backend.execute(plan).duration_s
    for request in plan.requests + plan.padding:
        backend.block_manager.free(request.request_id)
        backend.free(request)
    return plan, duration


# Shapes of at most this many rows run once untimed right before they are timed. In a run a
# step follows steps of about its own shape; in a round a shape follows an unrelated, often
# much larger one whose weights and activations evicted the caches, and a small step timed
# right after such a shape takes a few percent longer than it does in a run.
WARM_ROWS = 256


class GridProfile:
    """The grid's shapes with fixed prompt tokens, timed one round (every shape once) at a
    time, so rounds can be spread out: back to back (`measure`), or a shape at a
    time between the steps of `servelab validate`'s measured runs (`run_next`)."""

    def __init__(self, backend: ModelBackend, points: list[ProfilePoint], seed: int = 0
                 ) -> None:
        rng = np.random.default_rng(seed)
        vocab = backend.model.args.vocab_size
        # Shapes run on `backend`: `home` (the profile's own, with its own KV pool), or a
        # measured run's lent with `use` while that run is in progress.
        self.home = self.backend = backend
        self.points = points
        self.borrowed = 0  # timed runs made on a lent backend
        self.prompts = [point_prompts(p, vocab, rng) for p in points]
        self.plans: list[BatchPlan] = []  # each point's plan (for its features)
        self.rounds: list[list[float]] = []  # timed rounds' step seconds, one per point
        # What the machine was doing when each of those was timed (`tag` at the time:
        # validate sets it to the measured run in progress, None between runs).
        self.round_tags: list[list[Hashable]] = []
        self.tag: Hashable = None
        self._partial: list[float] = []  # the round run_next is part way through
        self._partial_tags: list[Hashable] = []

    def use(self, backend: ModelBackend | None = None) -> None:
        """Run shapes on `backend` from now on, each where its blocks fit in that pool's free
        ones and at home otherwise; None: at home. A measured run's backend is where its steps
        run: the same KV pool and buffers. Its step log records only its own steps."""
        self.backend = backend or self.home

    def _time(self, i: int, timed: bool = True) -> float:
        """Run shape i once (timed, one of <= WARM_ROWS rows right after an untimed run:
        runs' steps follow steps like them); its seconds."""
        point, prompts = self.points[i], self.prompts[i]
        backend = self.backend
        if (backend is not self.home
                and backend.block_manager.num_clean_blocks < point.blocks(backend.block_manager)):
            # The run holds too much of its pool for this shape now (cached blocks count as
            # held: taking them would change the run's prefix-cache hits).
            backend = self.home
        log, backend.step_log = backend.step_log, None
        try:
            if timed and point.rows <= WARM_ROWS:
                run_point(point, backend, prompts)
            plan, duration = run_point(point, backend, prompts)
        finally:
            backend.step_log = log
        if len(self.plans) == i:
            self.plans.append(plan)
        self.borrowed += timed and backend is not self.home
        return duration

    def run_round(self, timed: bool = True, on_run: Callable[[], None] | None = None) -> None:
        """Run every shape once; keep the times unless this is a warm-up (timed=False)."""
        times = []
        for i in range(len(self.points)):
            times.append(self._time(i, timed))
            if on_run is not None:
                on_run()
        if timed:
            self.rounds.append(times)
            self.round_tags.append([self.tag] * len(times))

    def run_next(self) -> None:
        """Time the next shape of the round in progress; a round is kept once complete."""
        self._partial.append(self._time(len(self._partial)))
        self._partial_tags.append(self.tag)
        if len(self._partial) == len(self.points):
            self.rounds.append(self._partial)
            self.round_tags.append(self._partial_tags)
            self._partial, self._partial_tags = [], []

    def finish_round(self) -> None:
        """Time the rest of the round in progress, if one is."""
        while self._partial:
            self.run_next()

    def finish(self, min_rounds: int = 2) -> None:
        """Finish the round in progress, then time whole rounds until there are min_rounds
        (two give the step jitter)."""
        self.finish_round()
        while len(self.rounds) < min_rounds:
            self.run_round()

    @property
    def times(self) -> np.ndarray:
        """[timed rounds, points] step seconds."""
        return np.asarray(self.rounds, dtype=float).reshape(len(self.rounds), len(self.points))


def relative_speeds(times: np.ndarray, tags: list[list[Hashable]]) -> dict[Hashable, float]:
    """How slow the machine ran under each tag: the median, over the timings taken under it,
    of timing / its shape's median over all rounds (times [rounds, points], tags alike).
    1.1 means shapes took 10% longer than usual while that tag was set."""
    times = np.asarray(times, dtype=float)
    ratios = times / np.median(times, axis=0)
    grouped: dict[Hashable, list[float]] = {}
    for row_ratios, row_tags in zip(ratios, tags, strict=True):
        for ratio, tag in zip(row_ratios, row_tags, strict=True):
            grouped.setdefault(tag, []).append(float(ratio))
    return {tag: float(np.median(values)) for tag, values in grouped.items()}


def measure(backend: ModelBackend, points: list[ProfilePoint], repeats: int = 3,
            seed: int = 0, on_run: Callable[[], None] | None = None
            ) -> tuple[list[BatchPlan], np.ndarray]:
    """The plan of each point and its step seconds in each timed round [repeats, n].

    A warm-up round over the whole grid, then `repeats` timed rounds: a point's runs are
    spread over the profile instead of back to back, so a slow spell on a shared machine
    lands on every point alike instead of on a few (back-to-back medians of the same grid
    differed by 13% median between two profiles on a 2-vCPU VM). on_run: after each run.
    """
    profile = GridProfile(backend, points, seed)
    profile.run_round(timed=False, on_run=on_run)
    for _ in range(repeats):
        profile.run_round(on_run=on_run)
    return profile.plans, profile.times
