"""Fit the calibrated cost model to profiled step times: coefficients, KV knee, step jitter,
and the error on shapes the fit did not see."""

from __future__ import annotations

import datetime
import math
import platform
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from executor.loading import LoadedModel, cpu_model
from sim.calibrated import (
    KNEE_CANDIDATES,
    CalibratedCostModel,
    fit_coefficients,
    plan_features,
    step_jitter,
)
from sim.scheduler import SchedulerConfig

HOLDOUT_EVERY = 4  # every 4th profiled shape is held out to measure the fit on unseen steps


def relative_errors(model: CalibratedCostModel, features: np.ndarray,
                    durations_s: np.ndarray) -> np.ndarray:
    """|predicted - measured| / measured for each profiled step."""
    predicted = features @ np.asarray(model.coefficients)
    return np.abs(predicted - durations_s) / durations_s


def choose_knee(plans: list, durations_s: np.ndarray, fit: np.ndarray) -> float:
    """The KV knee (KNEE_CANDIDATES) whose fit on the `fit` shapes has the least median
    relative error; infinite when no knee beats a model without one."""
    best, best_err = math.inf, math.inf
    for knee in KNEE_CANDIDATES:
        features = np.asarray([plan_features(plan, knee) for plan in plans])[fit]
        model = CalibratedCostModel(tuple(fit_coefficients(features, durations_s[fit])), knee)
        err = float(np.median(relative_errors(model, features, durations_s[fit])))
        if err < best_err - 1e-9:
            best, best_err = knee, err
    return best


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
        knee = self.model.knee_tokens
        model = self.model
        spread = (f"runs spread p10 {model.jitter_at(0.1):.2f} .. p90 {model.jitter_at(0.9):.2f}"
                  f" of their shape's median" if model.jitter
                  else "no step jitter (one timed round)")
        return "\n".join([
            f"decode KV knee: {'none' if math.isinf(knee) else f'{knee:.0f} tokens'}; {spread}",
            f"fit error (all shapes): median {np.median(self.fit_error):.1%}, "
            f"max {self.fit_error.max():.1%}",
            f"held-out shapes ({len(self.held_error)}): median {np.median(self.held_error):.1%}"
            f", p90 {np.percentile(self.held_error, 90):.1%}, max {self.held_error.max():.1%}"])


def fit_profile(plans: list, times_s: np.ndarray, speeds: np.ndarray | None = None) -> Fit:
    """Fit the cost model to profiled rounds ([rounds, shapes] seconds): coefficients and
    knee on each shape's median, every HOLDOUT_EVERY-th shape held out for a trial fit, and
    the step jitter from the rounds' spread (when there are two or more). speeds, if given
    ([rounds, shapes], executor.profile.relative_speeds), is the machine's slowness at each
    timing: the jitter is then the spread left once each timing is divided by it."""
    times_s = np.asarray(times_s, dtype=float)
    steady = times_s if speeds is None else times_s / np.asarray(speeds, dtype=float)
    durations = np.median(times_s, axis=0)
    held = np.arange(len(plans)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    knee = choose_knee(plans, durations, ~held)  # on the fitted shapes only
    features = np.asarray([plan_features(plan, knee) for plan in plans])
    trial = CalibratedCostModel(tuple(fit_coefficients(features[~held], durations[~held])),
                                knee)
    final = CalibratedCostModel(tuple(fit_coefficients(features, durations)), knee,
                                step_jitter(steady) if len(times_s) >= 2 else ())
    return Fit(final, relative_errors(final, features, durations),
               relative_errors(trial, features[held], durations[held]))


def profile_backend(loaded, block_size: int, kv_cache_gib: float,
                    max_model_len: int | None, quick: bool = False):
    """A ModelBackend on its own KV pool and the grid it can hold; with the pool's numbers."""
    from executor.backend import ModelBackend
    from executor.profile import profile_grid
    from sim.block_manager import BlockManager

    num_blocks = loaded.kv_blocks(block_size, kv_cache_gib)
    max_len = loaded.max_model_len(max_model_len)
    SchedulerConfig(num_blocks=num_blocks, block_size=block_size,
                    max_model_len=max_len)  # validates the numbers
    backend = ModelBackend(loaded.model, BlockManager(num_blocks, block_size))
    return backend, profile_grid(max_len, num_blocks * block_size, quick=quick), num_blocks, max_len


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
