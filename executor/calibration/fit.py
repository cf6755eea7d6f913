"""Fit the calibrated cost model to profiled step times: coefficients (with the row knots),
step jitter, and the error on shapes the fit did not see."""

from __future__ import annotations

import datetime
import platform
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from executor.loading import LoadedModel, cpu_model
from sim.cost.calibrated import (
    CalibratedCostModel,
    feature_names,
    fit_coefficients,
    plan_features,
    step_jitter,
)
from sim.engine.scheduler_config import SchedulerConfig

# Every shape's held-out error comes from a fit that did not see it: the grid is split into
# this many folds (every n-th shape), each predicted by a fit to the others.
HOLDOUT_FOLDS = 4


def relative_errors(model: CalibratedCostModel, features: np.ndarray,
                    durations_s: np.ndarray) -> np.ndarray:
    """|predicted - measured| / measured for each profiled step."""
    predicted = features @ np.asarray(model.coefficients)
    return np.abs(predicted - durations_s) / durations_s


def feature_matrix(plans: list, row_knots: tuple[int, ...] = (),
                   without: frozenset[str] = frozenset()) -> np.ndarray:
    """[plans, feature_names(row_knots)]; the columns named in `without` are zero, so a fit
    leaves those features out."""
    names = feature_names(row_knots)
    unknown = without - set(names)
    if unknown:
        raise ValueError(f"no such cost-model features: {', '.join(sorted(unknown))}")
    features = np.asarray([plan_features(plan, row_knots) for plan in plans], dtype=float)
    features[:, [i for i, name in enumerate(names) if name in without]] = 0.0
    return features


@dataclass(frozen=True)
class Fit:
    """A fitted calibration (no meta yet) and its errors on the profiled shapes."""

    model: CalibratedCostModel
    fit_error: np.ndarray  # every shape, the final fit
    held_error: np.ndarray  # held-out shapes, a fit without them

    def summary(self) -> dict:
        fit, held = self.fit_error, self.held_error
        return {"fit_error": {"median": float(np.median(fit)), "max": float(fit.max())},
                "holdout_error": {"median": float(np.median(held)),
                                  "p90": float(np.percentile(held, 90)),
                                  "max": float(held.max())}}

    def describe(self) -> str:
        model = self.model
        spread = (f"runs spread p10 {model.jitter_at(0.1):.2f} .. p90 {model.jitter_at(0.9):.2f}"
                  f" of their shape's median" if model.jitter
                  else "no step jitter (one timed round)")
        return "\n".join([
            f"row knots: {', '.join(map(str, model.row_knots)) or 'none'}; {spread}",
            f"fit error (all shapes): median {np.median(self.fit_error):.1%}, "
            f"max {self.fit_error.max():.1%}",
            f"held-out shapes ({len(self.held_error)}): median {np.median(self.held_error):.1%}"
            f", p90 {np.percentile(self.held_error, 90):.1%}, max {self.held_error.max():.1%}"])


def fit_profile(plans: list, times_s: np.ndarray, speeds: np.ndarray | None = None,
                row_knots: tuple[int, ...] = (), without: frozenset[str] = frozenset()) -> Fit:
    """Fit the cost model to profiled rounds ([rounds, shapes] seconds): the coefficients
    (fixed costs at row_knots too) on each shape's median, the held-out error of every shape
    from a fit without its fold (HOLDOUT_FOLDS), and the step jitter from the rounds' spread
    (two rounds or more).
    speeds, if given ([rounds, shapes], executor.profile.relative_speeds), is the machine's
    slowness at each timing: the jitter is then the spread left once each timing is divided
    by it. `without` names features to leave out."""
    times_s = np.asarray(times_s, dtype=float)
    steady = times_s if speeds is None else times_s / np.asarray(speeds, dtype=float)
    durations = np.median(times_s, axis=0)
    features = feature_matrix(plans, row_knots, without)

    held_error = held_out_errors(features, durations)
    model = CalibratedCostModel(tuple(fit_coefficients(features, durations)), row_knots)
    final = replace(model, jitter=step_jitter(steady) if len(times_s) >= 2 else ())
    return Fit(final, relative_errors(final, features, durations), held_error)


def held_out_errors(features: np.ndarray, durations_s: np.ndarray) -> np.ndarray:
    """Each row's relative error as predicted by a fit to the other folds (every
    HOLDOUT_FOLDS-th row is one fold)."""
    errors = np.empty(len(durations_s))
    for fold in range(HOLDOUT_FOLDS):
        held = np.arange(len(durations_s)) % HOLDOUT_FOLDS == fold
        coefficients = fit_coefficients(features[~held], durations_s[~held])
        errors[held] = np.abs(features[held] @ coefficients - durations_s[held]) / durations_s[held]
    return errors


def profile_backend(loaded, block_size: int, kv_cache_gib: float,
                    max_model_len: int | None, quick: bool = False,
                    speculative: bool = False, max_num_seqs: int | None = None):
    """A ModelBackend on its own KV pool and the grid it can hold (speculative decoding's
    verify steps too, if asked; no step of more than max_num_seqs sequences, if given); with
    the pool's numbers."""
    from executor.backend import ModelBackend
    from executor.profile import profile_grid
    from sim.engine.block_manager import BlockManager

    num_blocks = loaded.kv_blocks(block_size, kv_cache_gib)
    max_len = loaded.max_model_len(max_model_len)
    SchedulerConfig(num_blocks=num_blocks, block_size=block_size,
                    max_model_len=max_len)  # validates the numbers
    backend = ModelBackend(loaded.model, BlockManager(num_blocks, block_size))
    grid = profile_grid(max_len, num_blocks * block_size, quick, speculative, max_num_seqs)
    return backend, grid, num_blocks, max_len


def save_calibration(fit: Fit, path: Path, meta: dict) -> CalibratedCostModel:
    """The fitted model with meta (and its errors) written to path."""
    model = replace(fit.model, meta={**meta, **fit.summary()})
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    return model


def calibration_meta(loaded: LoadedModel, block_size: int, kv_cache_gib: float, num_blocks: int,
                     max_model_len: int, num_points: int, repeats: int) -> dict:
    """What a calibration was measured on: model, device, processor, threads, KV pool."""
    import torch

    device = loaded.device
    hardware = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else cpu_model())
    return {
        "model": loaded.name, "device": str(device), "hardware": hardware,
        "dtype": str(loaded.dtype).removeprefix("torch."), "threads": loaded.threads,
        "kernels": loaded.kernels, "torch": torch.__version__, "python": platform.python_version(),
        "date": datetime.date.today().isoformat(), "block_size": block_size,
        "num_blocks": num_blocks, "max_model_len": max_model_len,
        "kv_cache_gib": kv_cache_gib, "profiled_shapes": num_points,
        "repeats": repeats,
    }
