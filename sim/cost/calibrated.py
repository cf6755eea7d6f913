"""A cost model fitted to step times profiled on a real executor.

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

import json
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sim.engine.core import BatchPlan, Request, StepResult

# One feature per cost a step pays, each read off the BatchPlan's totals; docs/fidelity.md
# gives each one's physical meaning and what it buys in held-out error.
FEATURES = (
    "constant",  # per-step overhead: scheduling, building inputs, Python, kernel launches
    "prefill_step",  # 1 if a prefill chunk runs: the prefill path's own per-step overhead
    "tokens",  # computed rows (chunk tokens + decode rows + padding): the linear layers
    "sampled",  # rows with logits: the lm_head and sampling
    "seqs",  # sequences in the step: per-sequence index building and gathers
    "decode_kv",  # sum of decode KV lengths: KV bytes read
    "decode_kv_padded",  # decode rows x longest decode KV: a padded attention kernel's area
    "decode_kv_max",  # longest decode KV: a row's keys are read by one thread
    "prefill_attn",  # sum over chunks of chunk length x KV length: a masked kernel's area
    "prefill_attn_causal",  # the (query, key) pairs a causal kernel visits
    "prefill_attn_padded",  # chunks x longest chunk x longest KV: a padded kernel's area
    "mixed_step",  # 1 if a prefill chunk and decodes share the step
)
# With row knots (a calibration of the native kernels), a decode-only step also pays a fixed
# cost by its rows with logits, piecewise linear between the knots and flat past the last:
# the GEMM streams each weight once per tile of rows, so its time climbs in steps, and the
# lm_head, the largest weight of a small model, climbs them in sampled rows. The knots come
# from the kernels' tile sizes (executor.native.ROW_KNOTS) and are saved with the model.
KNOT_PREFIX = "decode_sampled_"
# Features added after calibrations were first shipped: a file without one fitted without it.
OPTIONAL_FEATURES = frozenset({"prefill_attn_causal", "decode_kv_max", "mixed_step"})
JITTER_QUANTILES = 100  # run / median at evenly spaced probabilities, 0.5% .. 99.5%
_MASK64 = (1 << 64) - 1


def feature_names(row_knots: tuple[int, ...] = ()) -> tuple[str, ...]:
    """FEATURES, then one fixed cost per row knot."""
    return FEATURES + tuple(f"{KNOT_PREFIX}{k}" for k in row_knots)


def plan_features(plan: BatchPlan, row_knots: tuple[int, ...] = ()) -> list[float]:
    """The features (feature_names(row_knots)) of one plan, in order."""
    features = [
        1.0,
        1.0 if plan.prefill_seqs else 0.0,
        float(plan.prefill_tokens + plan.decode_seqs),
        float(plan.num_sampled),
        float(plan.prefill_seqs + plan.decode_seqs),
        float(plan.decode_context),
        float(plan.decode_seqs * plan.decode_context_max),
        float(plan.decode_context_max),
        float(plan.prefill_attn),
        float(plan.prefill_attn_causal),
        float(plan.prefill_seqs * plan.prefill_chunk_max * plan.prefill_context_max),
        1.0 if plan.prefill_seqs and plan.decode_seqs else 0.0,
    ]
    if row_knots:
        features += (knot_weights(plan.num_sampled, row_knots) if not plan.prefill_tokens
                     else [0.0] * len(row_knots))
    return features


def knot_weights(rows: int, knots: tuple[int, ...]) -> list[float]:
    """Hat functions over `knots` at `rows`: the two knots around it share it linearly
    (weights summing to 1), the last knot takes every count past it; all 0 for no rows."""
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


def check_knots(knots: tuple[int, ...]) -> tuple[int, ...]:
    """The knots, if they are increasing positive row counts."""
    if any(not a < b for a, b in zip((0, *knots), knots, strict=False)):
        raise ValueError(f"row knots must be increasing positive rows, got {knots}")
    return knots


def fit_coefficients(features: np.ndarray, durations_s: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error: min ||(X c - y) / y|| with c >= 0."""
    from scipy.optimize import nnls

    features = np.asarray(features, dtype=float)
    durations_s = np.asarray(durations_s, dtype=float)
    if features.ndim != 2 or features.shape[1] < len(FEATURES):
        raise ValueError(f"features must be [n, >= {len(FEATURES)}], got {features.shape}")
    if len(durations_s) != len(features) or np.any(durations_s <= 0):
        raise ValueError("need one positive duration per feature row")
    weights = 1.0 / durations_s
    scale = np.abs(features).max(axis=0)  # condition the columns, then undo
    scale[scale == 0] = 1.0
    solution, _ = nnls(features * weights[:, None] / scale, np.ones_like(durations_s),
                       maxiter=50 * features.shape[1])
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

    coefficients: tuple[float, ...]  # one per feature_names(row_knots)
    row_knots: tuple[int, ...] = ()  # decode-only fixed costs by sampled rows (FEATURES)
    # Quantiles of profiled run time / shape median (step_jitter); () predicts the median.
    jitter: tuple[float, ...] = ()
    jitter_seed: int = 0  # another seed, another equally likely run
    # Seconds a request spends in a server before its first step can take it, plus the
    # seconds a token takes to reach the client: HTTP, tokenizing, queues between processes.
    # A calibration from a server's URL measures it; the simulator delays each arrival by it
    # (TTFT still counts from the arrival). 0 for the executor, which has no such path.
    request_overhead_s: float = 0.0
    # What it was measured on: model, device, dtype, torch version, processor, threads,
    # date, block size, KV pool, fit error. Free-form, saved as JSON.
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        check_knots(self.row_knots)
        names = self.features
        if len(self.coefficients) != len(names):
            raise ValueError(f"expected {len(names)} coefficients ({', '.join(names)}), "
                             f"got {len(self.coefficients)}")
        if any(not c >= 0 for c in self.coefficients):
            raise ValueError(f"coefficients must be >= 0, got {self.coefficients}")
        if not self.request_overhead_s >= 0:
            raise ValueError(f"request_overhead_s must be >= 0, got {self.request_overhead_s}")
        jitter = self.jitter
        if jitter and (len(jitter) < 2 or not jitter[0] > 0
                       or any(not b >= a for a, b in zip(jitter[:-1], jitter[1:], strict=True))):
            raise ValueError("jitter must be >= 2 positive, non-decreasing quantiles")

    @property
    def reads_rows(self) -> bool:
        """Jitter draws from the plan's first row; without it a plan's totals suffice."""
        return bool(self.jitter)

    @property
    def features(self) -> tuple[str, ...]:
        """The names of the coefficients, in order."""
        return feature_names(self.row_knots)

    def predict(self, plan: BatchPlan) -> float:
        """Seconds one engine step of `plan` takes; 0 for an empty plan."""
        if plan.requests or plan.unlisted_decodes or plan.padding:
            features = plan_features(plan, self.row_knots)
            return sum(c * f for c, f in zip(self.coefficients, features, strict=True))
        return 0.0

    def scaled(self, factor: float) -> CalibratedCostModel:
        """The same model on a machine `factor` times as slow (every step time x factor)."""
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        return replace(self, coefficients=tuple(c * factor for c in self.coefficients))

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
        """The predicted median step time scaled by the plan's jitter draw."""
        seconds = self.predict(plan)
        if seconds and self.jitter:
            seconds *= self.jitter_factor(plan)
        return StepResult(seconds)

    def free(self, request: Request) -> None:
        """Nothing to forget."""

    def save(self, path: Path) -> None:
        """Write the model as JSON (coefficients by feature name, plus meta)."""
        payload = {"features": dict(zip(self.features, self.coefficients, strict=True)),
                   "row_knots": list(self.row_knots),
                   "jitter": list(self.jitter), "request_overhead_s": self.request_overhead_s,
                   "meta": self.meta}
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
        try:
            knots = tuple(int(k) for k in payload.get("row_knots") or ())
            values = {name: float(value) for name, value in features.items()}
            jitter = tuple(float(q) for q in payload.get("jitter") or ())
            overhead = float(payload.get("request_overhead_s", 0.0))
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"{path}: calibration features, row knots, jitter and request "
                             f"overhead must be numbers") from None
        try:
            names = feature_names(check_knots(knots))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        missing = [name for name in names if name not in values and name not in OPTIONAL_FEATURES]
        if missing:
            raise ValueError(f"{path}: calibration lacks features {', '.join(missing)}")
        unknown = sorted(set(values) - set(names))
        if unknown:  # priced without them, its steps would come out wrong, silently
            raise ValueError(f"{path}: calibration has features this version does not price "
                             f"({', '.join(unknown)}); calibrate again")
        coefficients = tuple(values.get(name, 0.0) for name in names)
        try:
            return cls(coefficients, knots, jitter, request_overhead_s=overhead,
                       meta=dict(payload.get("meta", {})))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
