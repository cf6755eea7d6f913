"""A cost model fitted to step times profiled on a real executor (DESIGN.md section 6).

step_s = coefficients . features(plan), with non-negative coefficients fitted by NNLS on
relative error, so a 2 ms decode step weighs as much as a 2 s prefill. Saved as JSON with
what it was measured on and how well it fits.

The fit predicts a shape's median step time, but a real step of that shape rarely takes
exactly that: the calibration also keeps the spread of profiled runs around their shape's
median (quantiles of run / median), and each simulated step is scaled by a draw from it.
A run then sums mean step times rather than medians and its ITL tail has the hiccups a
measured run has. The draw is keyed by the plan's content, so a simulation stays
reproducible and independent of which other runs share the model.
"""

from __future__ import annotations

import bisect
import json
import math
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sim.core import BatchPlan, Request, StepResult

# A decode-only step's fixed cost by its row count, piecewise linear between these rows and
# flat past the last. The native GEMM (executor/csrc) streams every weight whole once per
# 6-row tile up to 12 rows, then switches to K-blocking, once per 144-row block: a staircase
# with steps at 6|7 and 12|13, not a line, then a slope of its own up to 144 rows. On
# peer-45m a 1-, 6-, 8-, 12- and 16-row decode took 6.4, 7.9, 11.6, 11.2 and 18.8 ms. A
# linear row term priced the runs' small decodes 3-8% high; knots at 12 and 16 priced steps
# with 13-15 rows sampling 30% low; flat past 13 (the per-row cost then the prefill's) priced
# 32-row decodes 8% low. Steps with a prefill chunk keep to the linear terms: knots on every
# step brought conv's prefill steps from 1.03-1.05 of their prediction to 1.00-1.02 but priced
# static steps with padding 6-10% low (README, session H).
# The lm_head streams its own weight (on peer-45m 65 MB, more than the 47 MB of all the
# layers) the same way per tile of *sampled* rows, so it climbs its own staircase in the
# rows with logits: the same rows in a continuous decode, not in a static step, whose
# finished rows are computed without logits. A 24-row step took 14.5 ms with 4 live rows,
# 21.2 ms with 24; priced by computed rows alone, static steps of 16-64 rows, most of them
# padding, came out 25% high against one-row decodes (code trace).
DECODE_ROW_KNOTS = (1, 2, 4, 6, 7, 12, 13, 144)
# One feature per cost a step pays; each is read off the BatchPlan's accumulated totals.
FEATURES = (
    "constant",  # per-step overhead: scheduling, input building, Python, launches
    "prefill_step",  # 1 if a prefill chunk runs: the prefill path's own per-step overhead
    "tokens",  # every computed row (prefill tokens + decode rows + padding): linear layers
    "sampled",  # rows with logits: lm_head and sampling
    "seqs",  # sequences in the step: per-sequence index building and gathers
    "decode_kv",  # sum of decode KV lengths: KV bytes read
    "decode_kv_padded",  # decode rows x longest decode KV: a padded kernel's attention area
    # Longest decode KV: the native kernel splits rows between threads, a row's keys on one
    # thread, so with few rows the longest sets the attention time (peer-45m, 2 threads: 1.9
    # us per key for a lone 1793-token row, 0.8 us for eight of them).
    "decode_kv_max",
    "prefill_attn",  # sum over chunks of chunk_len x KV length: a masked kernel's area
    "prefill_attn_causal",  # the (query, key) pairs a causal kernel visits (native CPU)
    "prefill_attn_padded",  # chunks x longest chunk x longest KV: a padded kernel's area
    # KV read past a knee, where it stops fitting the caches and each token costs more;
    # the knee (tokens) is chosen per calibration, infinite (no excess) if none helps.
    "decode_kv_excess",  # max(0, decode_kv - knee)
    "decode_kv_padded_excess",  # max(0, decode_kv_padded - knee)
    # 1 if a prefill chunk and decodes share the step. Such steps cost more than their rows,
    # chunks and KV price on either side: without this term the grid's mixed shapes came to
    # 1.02 of the fit and conv's in-run steps with a chunk to 1.02-1.04 (one profile, timed
    # during three conv runs, fitted both ways: 0.99-1.01 with it); code continuous's went
    # from 1.08 to 1.06, and no decode step moved by more than 0.001.
    "mixed_step",
    *(f"decode_rows_{k}" for k in DECODE_ROW_KNOTS),  # decode-only steps (DECODE_ROW_KNOTS)
    *(f"decode_sampled_{k}" for k in DECODE_ROW_KNOTS),  # the same, by rows with logits
)
# Features added after calibrations were first shipped: a file without one fitted without it.
OPTIONAL_FEATURES = frozenset({"prefill_attn_causal", "decode_kv_max", "mixed_step",
                               *(f"decode_rows_{k}" for k in DECODE_ROW_KNOTS),
                               *(f"decode_sampled_{k}" for k in DECODE_ROW_KNOTS)})
KNEE_CANDIDATES = (math.inf, 2048, 4096, 8192, 16384, 32768)  # tokens of decode KV
# How fast the machine ran over a run: (from_s, factor) pairs, from_s increasing; from each
# time on (the engine's clock), steps took factor times as long as usual.
Drift = tuple[tuple[float, float], ...]
JITTER_QUANTILES = 100  # run / median at evenly spaced probabilities, 0.5% .. 99.5%
_MASK64 = (1 << 64) - 1


def plan_features(plan: BatchPlan, knee_tokens: float = math.inf) -> list[float]:
    """The FEATURES of one plan, in order, with the KV knee at knee_tokens."""
    decode_kv_padded = plan.decode_seqs * plan.decode_context_max
    return [
        1.0,
        1.0 if plan.prefill_seqs else 0.0,
        float(plan.prefill_tokens + plan.decode_seqs),
        float(plan.num_sampled),
        float(plan.prefill_seqs + plan.decode_seqs),
        float(plan.decode_context),
        float(decode_kv_padded),
        float(plan.decode_context_max),
        float(plan.prefill_attn),
        float(plan.prefill_attn_causal),
        float(plan.prefill_seqs * plan.prefill_chunk_max * plan.prefill_context_max),
        max(0.0, plan.decode_context - knee_tokens),
        max(0.0, decode_kv_padded - knee_tokens),
        1.0 if plan.prefill_seqs and plan.decode_seqs else 0.0,
        *(decode_row_weights(plan.decode_seqs) + decode_row_weights(plan.num_sampled)
          if not plan.prefill_tokens else [0.0] * (2 * len(DECODE_ROW_KNOTS))),
    ]


def decode_row_weights(rows: int) -> list[float]:
    """Hat functions over DECODE_ROW_KNOTS at `rows`: the two knots around it share it
    linearly (weights summing to 1), the last knot takes every count past it; all 0 for
    no rows."""
    knots = DECODE_ROW_KNOTS
    weights = [0.0] * len(knots)
    if rows >= knots[-1]:
        weights[-1] = 1.0
        return weights
    for i, (lo, hi) in enumerate(zip(knots[:-1], knots[1:], strict=True)):
        if lo <= rows < hi:
            weights[i + 1] = (rows - lo) / (hi - lo)
            weights[i] = 1.0 - weights[i + 1]
            break
    return weights


def fit_coefficients(features: np.ndarray, durations_s: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error: min ||(X c - y) / y|| with c >= 0."""
    from scipy.optimize import nnls

    features = np.asarray(features, dtype=float)
    durations_s = np.asarray(durations_s, dtype=float)
    if features.ndim != 2 or features.shape[1] != len(FEATURES):
        raise ValueError(f"features must be [n, {len(FEATURES)}], got {features.shape}")
    if len(durations_s) != len(features) or np.any(durations_s <= 0):
        raise ValueError("need one positive duration per feature row")
    weights = 1.0 / durations_s
    scale = np.abs(features).max(axis=0)  # condition the columns, then undo
    scale[scale == 0] = 1.0
    solution, _ = nnls(features * weights[:, None] / scale, np.ones_like(durations_s),
                       maxiter=50 * len(FEATURES))
    return solution / scale


def step_jitter(times_s: np.ndarray) -> tuple[float, ...]:
    """Quantiles (JITTER_QUANTILES, 0.5% to 99.5%) of each profiled run's time over its
    shape's median, pooled over shapes: times_s is [rounds, shapes], one run of every shape
    per round. Each round is first divided by its own median ratio: a round that ran in a slow
    spell says how fast the machine was, not how much one step varies, and a simulated run
    is compared with the median of several measured ones, where such spells even out. The
    extremes are left out: a lone 30x stall of a millisecond step is not a rate to replay."""
    times_s = np.asarray(times_s, dtype=float)
    if times_s.ndim != 2 or times_s.shape[0] < 2 or np.any(times_s <= 0):
        raise ValueError("step jitter needs positive times of >= 2 runs per shape")
    ratios = times_s / np.median(times_s, axis=0)
    ratios /= np.median(ratios, axis=1, keepdims=True)
    return tuple(float(q) for q in np.quantile(ratios, np.linspace(0.005, 0.995, JITTER_QUANTILES)))


def speed_at(drift: Drift, t: float) -> float:
    """The factor in force at time t: the last window starting at or before t (the first
    before it starts); 1 without drift."""
    if not drift:
        return 1.0
    return drift[max(bisect.bisect_right(drift, t, key=lambda window: window[0]) - 1, 0)][1]


def _unit_draw(plan: BatchPlan, seed: int) -> float:
    """A number in [0, 1) fixed by the seed and the plan's first row, row count and tokens
    (splitmix64)."""
    first = plan.requests[0] if plan.requests else plan.padding[0]
    x = ((zlib.crc32(first.request_id.encode()) + (seed << 32)) * 0x9E3779B97F4A7C15
         + first.num_computed_tokens * 0xD1B54A32D192ED03
         + (len(plan.requests) + len(plan.padding)) * 0x8CB92BA72F3D8DD7
         + plan.prefill_tokens) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) / 2.0**64


@dataclass(frozen=True, slots=True)
class CalibratedCostModel:
    """A Backend whose step time is a fitted linear model of the plan's features."""

    coefficients: tuple[float, ...]
    knee_tokens: float = math.inf  # decode KV past which tokens cost more (FEATURES)
    # Quantiles of profiled run time / shape median (step_jitter); () predicts the median.
    jitter: tuple[float, ...] = ()
    jitter_seed: int = 0  # another seed, another equally likely run
    # The machine's speed over the run replayed (Drift; () for its usual speed throughout):
    # each step is scaled by the factor in force when it was scheduled.
    drift: Drift = ()
    # What it was measured on: model, device, dtype, torch version, processor, threads,
    # date, block size, KV pool, fit error. Free-form, saved as JSON.
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if len(self.coefficients) != len(FEATURES):
            raise ValueError(f"expected {len(FEATURES)} coefficients ({', '.join(FEATURES)}), "
                             f"got {len(self.coefficients)}")
        if any(not c >= 0 for c in self.coefficients):
            raise ValueError(f"coefficients must be >= 0, got {self.coefficients}")
        if not self.knee_tokens > 0:
            raise ValueError(f"knee_tokens must be > 0, got {self.knee_tokens}")
        jitter = self.jitter
        if jitter and (len(jitter) < 2 or not jitter[0] > 0
                       or any(not b >= a for a, b in zip(jitter[:-1], jitter[1:], strict=True))):
            raise ValueError("jitter must be >= 2 positive, non-decreasing quantiles")
        starts = [start for start, _ in self.drift]
        if (any(not factor > 0 for _, factor in self.drift)
                or any(not b > a for a, b in zip(starts[:-1], starts[1:], strict=True))):
            raise ValueError("drift must be (from_s, factor) pairs with increasing from_s and "
                             "factors > 0")

    def predict(self, plan: BatchPlan) -> float:
        """Seconds one engine step of `plan` takes; 0 for an empty plan."""
        if plan.requests or plan.padding:
            features = plan_features(plan, self.knee_tokens)
            return sum(c * f for c, f in zip(self.coefficients, features, strict=True))
        return 0.0

    def scaled(self, factor: float) -> CalibratedCostModel:
        """The same model on a machine `factor` times as slow (every step time x factor)."""
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        return replace(self, coefficients=tuple(c * factor for c in self.coefficients))

    def drifting(self, drift: Drift) -> CalibratedCostModel:
        """The same model on a machine whose speed moved over the run as `drift` says."""
        return replace(self, drift=tuple((float(start), float(factor)) for start, factor in drift))

    def jitter_at(self, u: float) -> float:
        """The step-time factor a draw u in [0, 1] gives: linear between the jitter
        quantiles; 1 without jitter."""
        jitter = self.jitter
        if not jitter:
            return 1.0
        at = u * (len(jitter) - 1)
        i = min(int(at), len(jitter) - 2)
        return jitter[i] + (jitter[i + 1] - jitter[i]) * (at - i)

    def jitter_factor(self, plan: BatchPlan) -> float:
        """The plan's draw from the jitter quantiles; 1 without."""
        return self.jitter_at(_unit_draw(plan, self.jitter_seed)) if self.jitter else 1.0

    def execute(self, plan: BatchPlan) -> StepResult:
        """The predicted median step time scaled by the plan's jitter draw and by the
        machine's speed when the plan was scheduled."""
        seconds = self.predict(plan)
        if seconds:
            seconds *= self.jitter_factor(plan) * speed_at(self.drift, plan.scheduled_s)
        return StepResult(seconds)

    def free(self, request: Request) -> None:
        """Nothing to forget."""

    def save(self, path: Path) -> None:
        """Write the model as JSON (coefficients by feature name, plus meta)."""
        payload = {"features": dict(zip(FEATURES, self.coefficients, strict=True)),
                   "knee_tokens": None if math.isinf(self.knee_tokens) else self.knee_tokens,
                   "jitter": list(self.jitter), "meta": self.meta}
        path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CalibratedCostModel:
        """Read a model saved by `save`; errors name the file and the bad field."""
        path = Path(path)
        try:
            payload = json.loads(path.read_text())
            features = payload["features"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a servelab calibration ({exc})") from None
        missing = [name for name in FEATURES
                   if name not in features and name not in OPTIONAL_FEATURES]
        if missing:
            raise ValueError(f"{path}: calibration lacks features {', '.join(missing)}")
        unknown = sorted(set(features) - set(FEATURES))
        if unknown:  # priced without them, its steps would come out wrong, silently
            raise ValueError(f"{path}: calibration has features this version does not price "
                             f"({', '.join(unknown)}); calibrate again")
        try:
            coefficients = tuple(float(features.get(name, 0.0)) for name in FEATURES)
            knee = payload.get("knee_tokens")
            knee = math.inf if knee is None else float(knee)
            jitter = tuple(float(q) for q in payload.get("jitter") or ())
        except (TypeError, ValueError):
            raise ValueError(f"{path}: calibration features, knee and jitter must be "
                             f"numbers") from None
        try:
            return cls(coefficients, knee, jitter, meta=dict(payload.get("meta", {})))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
