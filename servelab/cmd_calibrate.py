"""`servelab calibrate`: profile the executor, fit the cost model, save it as JSON."""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from servelab.model_args import add_model_args, load_model_from_args
from sim.calibrated import (
    KNEE_CANDIDATES,
    CalibratedCostModel,
    fit_coefficients,
    plan_features,
    step_jitter,
)
from sim.scheduler import SchedulerConfig

HOLDOUT_EVERY = 4  # every 4th profiled shape is held out to measure the fit on unseen steps


def register(subparsers: argparse._SubParsersAction) -> None:
    cal = subparsers.add_parser("calibrate", help="profile the executor and fit a cost model")
    add_model_args(cal)
    cal.add_argument("--out", type=Path, required=True, help="calibration JSON to write")
    cal.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    cal.add_argument("--max-model-len", type=int, default=None)
    cal.add_argument("--repeats", type=int, default=15,
                     help="timed rounds over the grid (median per shape)")
    cal.add_argument("--quick", action="store_true", help="a small grid (smoke tests)")
    cal.add_argument("--seed", type=int, default=0, help="random weights and prompt tokens")
    cal.set_defaults(func=_run)


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


def _run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    loaded = load_model_from_args(args)
    backend, points, num_blocks, max_len = profile_backend(
        loaded, args.block_size, args.kv_cache_gib, args.max_model_len, args.quick)
    from executor.profile import measure

    with tqdm(total=len(points) * (args.repeats + 1), unit="step", file=sys.stderr,
              leave=False, disable=None) as bar:
        plans, times = measure(backend, points, args.repeats, args.seed, bar.update)
    fit = fit_profile(plans, times)
    save_calibration(fit, args.out, calibration_meta(args, loaded, num_blocks, max_len,
                                                     len(points), len(times)))
    print(f"profiled {len(points)} step shapes of {loaded.name} on {loaded.device} "
          f"({loaded.threads} threads, {loaded.kernels} kernels)")
    print(fit.describe())
    print(f"wrote {args.out}")
    return 0


def save_calibration(fit: Fit, path: Path, meta: dict) -> CalibratedCostModel:
    """The fitted model with meta (and its errors) written to path."""
    model = replace(fit.model, meta={**meta, **fit.summary()})
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    return model


def calibration_meta(args: argparse.Namespace, loaded, num_blocks: int, max_model_len: int,
                     num_points: int, repeats: int) -> dict:
    """What a calibration was measured on (args: block_size, kv_cache_gib)."""
    import torch

    device = loaded.device
    hardware = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else platform.processor() or platform.machine())
    return {
        "model": loaded.name, "device": str(device), "hardware": hardware,
        "dtype": str(loaded.dtype).removeprefix("torch."), "threads": loaded.threads,
        "kernels": loaded.kernels, "torch": torch.__version__, "python": platform.python_version(),
        "date": datetime.date.today().isoformat(), "block_size": args.block_size,
        "num_blocks": num_blocks, "max_model_len": max_model_len,
        "kv_cache_gib": args.kv_cache_gib, "profiled_shapes": num_points,
        "repeats": repeats,
    }
