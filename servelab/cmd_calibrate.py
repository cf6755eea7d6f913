"""`servelab calibrate`: profile the executor, fit the cost model, save it as JSON."""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from servelab.model_args import add_model_args, load_model_from_args
from sim.calibrated import (
    KNEE_CANDIDATES,
    CalibratedCostModel,
    fit_coefficients,
    plan_features,
)
from sim.scheduler import SchedulerConfig

HOLDOUT_EVERY = 4  # every 4th profiled shape is held out to measure the fit on unseen steps


def register(subparsers: argparse._SubParsersAction) -> None:
    cal = subparsers.add_parser("calibrate", help="profile the executor and fit a cost model")
    add_model_args(cal)
    cal.add_argument("--out", type=Path, required=True, help="calibration JSON to write")
    cal.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    cal.add_argument("--max-model-len", type=int, default=None)
    cal.add_argument("--repeats", type=int, default=9,
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


def _run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    loaded = load_model_from_args(args)
    num_blocks = loaded.kv_blocks(args.block_size, args.kv_cache_gib)
    max_model_len = loaded.max_model_len(args.max_model_len)
    SchedulerConfig(num_blocks=num_blocks, block_size=args.block_size,
                    max_model_len=max_model_len)  # validates the numbers
    from executor.backend import ModelBackend
    from executor.profile import measure, profile_grid
    from sim.block_manager import BlockManager

    backend = ModelBackend(loaded.model, BlockManager(num_blocks, args.block_size))
    points = profile_grid(max_model_len, num_blocks * args.block_size, quick=args.quick)
    with tqdm(total=len(points) * (args.repeats + 1), unit="step", file=sys.stderr,
              leave=False, disable=None) as bar:
        plans, durations = measure(backend, points, args.repeats, args.seed, bar.update)
    held = np.arange(len(points)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    knee = choose_knee(plans, durations, ~held)  # on the fitted shapes only
    features = np.asarray([plan_features(plan, knee) for plan in plans])
    trial = CalibratedCostModel(tuple(fit_coefficients(features[~held], durations[~held])),
                                knee)
    held_err = relative_errors(trial, features[held], durations[held])
    final = CalibratedCostModel(tuple(fit_coefficients(features, durations)), knee)
    fit_err = relative_errors(final, features, durations)
    meta = _meta(args, loaded, num_blocks, max_model_len, len(points), fit_err, held_err)
    model = CalibratedCostModel(final.coefficients, knee, meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.out)
    print(f"profiled {len(points)} step shapes of {loaded.name} on {loaded.device} "
          f"({loaded.threads} threads)")
    print(f"decode KV knee: {'none' if math.isinf(knee) else f'{knee:.0f} tokens'}")
    print(f"fit error (all shapes): median {np.median(fit_err):.1%}, max {fit_err.max():.1%}")
    print(f"held-out shapes ({held.sum()}): median {np.median(held_err):.1%}, "
          f"p90 {np.percentile(held_err, 90):.1%}, max {held_err.max():.1%}")
    print(f"wrote {args.out}")
    return 0


def _meta(args: argparse.Namespace, loaded, num_blocks: int, max_model_len: int,
          num_points: int, fit_err: np.ndarray, held_err: np.ndarray) -> dict:
    import torch

    device = loaded.device
    hardware = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else platform.processor() or platform.machine())
    return {
        "model": loaded.name, "device": str(device), "hardware": hardware,
        "dtype": str(loaded.dtype).removeprefix("torch."), "threads": loaded.threads,
        "torch": torch.__version__, "python": platform.python_version(),
        "date": datetime.date.today().isoformat(), "block_size": args.block_size,
        "num_blocks": num_blocks, "max_model_len": max_model_len,
        "kv_cache_gib": args.kv_cache_gib, "profiled_shapes": num_points,
        "repeats": args.repeats,
        "fit_error": {"median": float(np.median(fit_err)), "max": float(fit_err.max())},
        "holdout_error": {"median": float(np.median(held_err)),
                          "p90": float(np.percentile(held_err, 90)),
                          "max": float(held_err.max())},
    }
