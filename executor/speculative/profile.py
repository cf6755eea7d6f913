"""Profile the executor's drafter passes, for a cost model of them: the drafter's first pass
(matching each row's KV with its sequence, then computing the row's tokens past it) and its
later passes (one proposal a row), each the forward of the target's first N layers with the
embedding, final norm and LM head, its inputs and one argmax a row.

A point is R rows that each compute n tokens over c tokens already in the drafter's KV (an
untimed propose put them there, as an earlier step does in a run), then propose PASSES tokens:
the first pass is timed as a point of (R, c, n), each later pass as one of R rows computing one
token. n is 1 or 2 in a run's steady state and a row's whole sequence at its first verify.
Points are timed once per round, in rounds over the grid (as executor.profile.measure does), so
a slow spell of a shared machine spreads over them. Drafters of the target's first layer and
of all its layers are profiled, so a simulation prices any depth (sim.cost.drafter).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from executor.backend import ModelBackend
from executor.model import Transformer
from executor.speculative.drafter import DraftModel, first_layers_model
from sim.cost.calibrated import feature_names, fit_coefficients, plan_features
from sim.engine.batch_plan import add_to_plan
from sim.engine.core import BatchPlan, Request

PASSES = 3  # proposals per profiled propose: its first pass and PASSES - 1 later ones


@dataclass(frozen=True)
class PassPoint:
    """One drafter pass: rows, each computing new_tokens over context tokens in its KV."""

    rows: int
    context: int
    new_tokens: int

    def plan(self) -> BatchPlan:
        """The pass as a step's plan: what the cost model's features read."""
        plan = BatchPlan()
        for i in range(self.rows):
            request = Request(f"pass-{i}", 0.0, self.context + self.new_tokens, 1)
            request.num_computed_tokens = self.context
            add_to_plan(plan, request, self.new_tokens)
        return plan


def pass_grid(max_rows: int, max_model_len: int, max_kv_tokens: int,
              row_knots: tuple[int, ...] = (), quick: bool = False) -> list[PassPoint]:
    """Proposal passes (one token a row) by rows and KV length, and catch-up passes (a row's
    first verify computes its whole sequence), capped by the model length and the KV pool."""
    rows = (1, 4, 16) if quick else (1, 2, 4, 8, 16, 32, 64)
    rows = sorted({r for r in (*rows, *row_knots) if r <= max_rows})
    contexts = (32, 512) if quick else (32, 256, 1024)
    points = [PassPoint(r, c, n) for r in rows for c in contexts for n in (1, 2)
              if c + n + PASSES <= max_model_len]
    chunks = (16, 128) if quick else (16, 64, 256)
    points += [PassPoint(r, 0, n) for r in (1, 4) for n in chunks
               if n + PASSES <= max_model_len]
    return [p for p in points if p.rows * (p.context + p.new_tokens + PASSES) <= max_kv_tokens]


class PassProfile:
    """Times pass points on drafters made of the target's first N layers, for several N."""

    def __init__(self, target: Transformer, layer_counts: tuple[int, ...],
                 num_blocks: int, block_size: int, seed: int = 0) -> None:
        weight = target.tok_embeddings
        self.vocab_size = target.args.vocab_size
        self.drafters = {n: DraftModel(first_layers_model(target, n), self.vocab_size,
                                       num_blocks, block_size, weight.device, weight.dtype)
                         for n in layer_counts}
        self.rng = np.random.default_rng(seed)

    def time_point(self, num_layers: int, point: PassPoint) -> PassTimes:
        """One propose of `point` on the num_layers drafter, timed pass by pass."""
        drafter = self.drafters[num_layers]
        sequences = [self.rng.integers(3, self.vocab_size, point.context + point.new_tokens)
                     .tolist() for _ in range(point.rows)]
        ids = [f"pass-{i}" for i in range(point.rows)]
        with torch.inference_mode():
            if point.context:  # an untimed pass puts the context in the drafter's KV
                drafter.propose(_proposing([s[:point.context] for s in sequences], ids, 1))
            plan = _proposing(sequences, ids, PASSES)
            start = time.perf_counter()
            drafter.propose(plan)
            total = time.perf_counter() - start
        for rid in ids:
            drafter.free(rid)
        marks = drafter.pass_marks_s
        later = [b - a for a, b in zip(marks[1:-1], marks[2:], strict=True)]
        return PassTimes(total - sum(later), tuple(later))

    def run_round(self, points: list[PassPoint],
                  times: dict[int, list[PassTimes]] | None = None) -> None:
        """Time every point once on every drafter (layer counts and points take turns),
        appending each time to times[layer count]; None: a warm-up, nothing kept."""
        for point in points:
            for n in self.drafters:
                timed = self.time_point(n, point)
                if times is not None:
                    times[n].append(timed)

    def measure(self, points: list[PassPoint], repeats: int) -> dict[int, list[PassTimes]]:
        """Per layer count, each point's times per timed round [repeats x points, round by
        round], after an untimed round."""
        times: dict[int, list[PassTimes]] = {n: [] for n in self.drafters}
        self.run_round(points)
        for _ in range(repeats):
            self.run_round(points, times)
        return times


class PassTimes(NamedTuple):
    """One propose's seconds: its first pass (with matching the rows' KV), then each later."""

    first_s: float
    later_s: tuple[float, ...]


PASS_REPEATS = 5  # timed rounds over the pass grid (median per point)


def drafter_pass_profile(backend: ModelBackend, max_model_len: int, max_rows: int = 64,
                         seed: int = 0, quick: bool = False
                         ) -> tuple[PassProfile, list[PassPoint]]:
    """The drafters profiled (the target's first layer and all its layers) and the pass
    points they are timed on, for the backend's model and KV pool."""
    target = backend.model
    knots, pool = backend.row_knots, backend.block_manager
    points = pass_grid(max_rows, max_model_len, pool.num_blocks * pool.block_size, knots, quick)
    need = max(p.rows * ((p.context + p.new_tokens + PASSES) // pool.block_size + 2)
               for p in points)
    depths = tuple(sorted({1, target.args.n_layers}))
    return PassProfile(target, depths, min(need, pool.num_blocks), pool.block_size,
                       seed), points


def profile_drafter_passes(backend: ModelBackend, max_model_len: int, max_rows: int = 64,
                           repeats: int = PASS_REPEATS, seed: int = 0,
                           quick: bool = False) -> dict[str, Any]:
    """A calibration's `drafter_passes` record (fit_drafter_passes), timed now."""
    profile, points = drafter_pass_profile(backend, max_model_len, max_rows, seed, quick)
    return fit_drafter_passes(backend, points, profile.measure(points, repeats))


def fit_drafter_passes(backend: ModelBackend, points: list[PassPoint],
                       times: dict[int, list[PassTimes]]) -> dict[str, Any]:
    """A calibration's `drafter_passes` record from timed rounds of the points (times per
    drafter depth, round by round): per depth profiled (1 and the target's layers), the
    fitted coefficients by feature name of its first pass and of a later pass, and their fit
    errors (median relative, over the points' medians)."""
    target, knots = backend.model, backend.row_knots
    repeats = len(next(iter(times.values()))) // len(points)
    # A later pass j (from 2) computes proposal j - 1 over c + n + j - 2 tokens of KV.
    later_points = [PassPoint(p.rows, p.context + p.new_tokens + j, 1)
                    for p in points for j in range(PASSES - 1)]
    fits: dict[str, dict] = {}
    errors: dict[str, dict] = {}
    for depth, timed in times.items():
        first = np.array([t.first_s for t in timed]).reshape(repeats, len(points))
        later = np.array([t.later_s for t in timed]).reshape(repeats, len(later_points))
        fits[str(depth)], errors[str(depth)] = {}, {}
        for name, grid, seconds in (("first", points, first), ("later", later_points, later)):
            coefficients, error = _fit(grid, np.median(seconds, axis=0), knots)
            fits[str(depth)][name], errors[str(depth)][name] = coefficients, error
    return {"target_layers": target.args.n_layers, "row_knots": list(knots), "layers": fits,
            "fit_error_median": errors, "profiled_passes": len(points), "repeats": repeats}


def _fit(points: list[PassPoint], seconds: np.ndarray, knots: tuple[int, ...]
         ) -> tuple[dict[str, float], float]:
    """Coefficients by feature name fitted to the points' median seconds, and the median
    relative error of the fit."""
    features = np.asarray([plan_features(p.plan(), knots) for p in points], dtype=float)
    coefficients = fit_coefficients(features, seconds)
    error = float(np.median(np.abs(features @ coefficients - seconds) / seconds))
    return dict(zip(feature_names(knots), map(float, coefficients), strict=True)), error


def _proposing(sequences: list[list[int]], ids: list[str], k: int) -> BatchPlan:
    """A plan whose rows each ask the drafter for k proposals (k passes)."""
    plan = BatchPlan()
    for rid, tokens in zip(ids, sequences, strict=True):
        request = Request(rid, 0.0, len(tokens), 1, prompt_token_ids=tokens)
        plan.requests.append(request)
        plan.num_spec_tokens[rid] = k
    return plan
