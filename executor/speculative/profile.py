"""Profile the executor's drafter passes: one DraftModel pass (its inputs, the forward of the
target's first N layers with the embedding, final norm and LM head, one argmax per row) over
a grid of rows, KV lengths and tokens per row, for a cost model of the drafter's passes.

A pass of R rows that each compute n tokens over c tokens already in the drafter's KV is
timed after an untimed pass has put those c tokens in the KV, as in a run: the drafter's
pass 1 catches a row up (n > 1 at a row's first verify, 1 or 2 after), passes 2..k compute
one token a row. Each point is timed once per round, in rounds over the grid (as
executor.profile.measure does), so a slow spell of a shared machine spreads over the points.
Drafters of the target's first layer and of all its layers are profiled and fitted on the
calibration's features, so a simulation prices a draft model of any depth (sim.cost.drafter).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from executor.backend import ModelBackend
from executor.model import Transformer
from executor.speculative.drafter import DraftModel, first_layers_model
from sim.cost.calibrated import feature_names, fit_coefficients, plan_features
from sim.engine.batch_plan import add_to_plan
from sim.engine.core import BatchPlan, Request


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
    points = [PassPoint(r, c, 1) for r in rows for c in contexts if c < max_model_len]
    chunks = (16, 128) if quick else (2, 16, 64, 256)
    points += [PassPoint(r, c, n) for r in (1, 4) for c in (0, 64) for n in chunks
               if c + n <= max_model_len]
    return [p for p in points if p.rows * (p.context + p.new_tokens + 1) <= max_kv_tokens]


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

    def time_pass(self, num_layers: int, point: PassPoint) -> float:
        """Seconds of one pass of `point` on the num_layers drafter."""
        drafter = self.drafters[num_layers]
        sequences = [self.rng.integers(3, self.vocab_size, point.context + point.new_tokens)
                     .tolist() for _ in range(point.rows)]
        ids = [f"pass-{i}" for i in range(point.rows)]
        with torch.inference_mode():
            if point.context:  # an untimed pass puts the context in the drafter's KV
                drafter.propose(_one_pass([s[:point.context] for s in sequences], ids))
            plan = _one_pass(sequences, ids)
            start = time.perf_counter()
            drafter.propose(plan)
            seconds = time.perf_counter() - start
        for rid in ids:
            drafter.free(rid)
        return seconds

    def measure(self, points: list[PassPoint], repeats: int) -> dict[int, np.ndarray]:
        """Per layer count, every point's seconds in each timed round [repeats, points],
        after an untimed round; layer counts and points take turns within a round."""
        times = {n: np.zeros((repeats, len(points))) for n in self.drafters}
        for r in range(-1, repeats):
            for i, point in enumerate(points):
                for n in self.drafters:
                    seconds = self.time_pass(n, point)
                    if r >= 0:
                        times[n][r, i] = seconds
        return times


PASS_REPEATS = 5  # timed rounds over the pass grid (median per point)


def profile_drafter_passes(backend: ModelBackend, max_model_len: int, max_rows: int = 64,
                           repeats: int = PASS_REPEATS, seed: int = 0,
                           quick: bool = False) -> dict[str, Any]:
    """A calibration's `drafter_passes` record: per drafter depth profiled (1 and the
    target's layers), one pass's fitted coefficients by feature name, and the fit errors."""
    target = backend.model
    knots, pool = backend.row_knots, backend.block_manager
    points = pass_grid(max_rows, max_model_len, pool.num_blocks * pool.block_size, knots, quick)
    need = max(p.rows * ((p.context + p.new_tokens) // pool.block_size + 2) for p in points)
    depths = tuple(sorted({1, target.args.n_layers}))
    profile = PassProfile(target, depths, min(need, pool.num_blocks), pool.block_size, seed)
    times = profile.measure(points, repeats)
    features = np.asarray([plan_features(p.plan(), knots) for p in points], dtype=float)
    fits, errors = {}, {}
    for depth, seconds in times.items():
        medians = np.median(seconds, axis=0)
        coefficients = fit_coefficients(features, medians)
        fits[str(depth)] = dict(zip(feature_names(knots), map(float, coefficients), strict=True))
        errors[str(depth)] = float(np.median(np.abs(features @ coefficients - medians)
                                             / medians))
    return {"target_layers": target.args.n_layers, "row_knots": list(knots), "layers": fits,
            "fit_error_median": errors, "profiled_passes": len(points), "repeats": repeats}


def _one_pass(sequences: list[list[int]], ids: list[str]) -> BatchPlan:
    """A plan whose rows each ask the drafter for one proposal: a single pass."""
    plan = BatchPlan()
    for rid, tokens in zip(ids, sequences, strict=True):
        request = Request(rid, 0.0, len(tokens), 1, prompt_token_ids=tokens)
        plan.requests.append(request)
        plan.num_spec_tokens[rid] = 1
    return plan
