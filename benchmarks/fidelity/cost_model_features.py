"""What each cost-model feature buys: one measured sitting, the cost model fitted with and
without each feature, every variant judged on the same data.

The trace runs once per policy on the executor with the profile grid timed between its
steps (as `servelab validate --calibrate` does). Then, per variant, the grid is fitted
without the variant's features and the runs are simulated with that fit, and the variant
gets three scores: the held-out error of the grid's shapes (every shape predicted by a fit
that did not see it), validate's median and largest |error| over the summary metrics, and
the median measured / predicted of the runs' own steps with a prefill chunk (each divided by
its run's speed; median over the policies). --save keeps the sitting (a pickle) so that
sittings made at other times can be scored again with --load, side by side.

    python benchmarks/fidelity/cost_model_features.py --trace azure-conv --max-requests 300 \\
        --length-scale 0.1 --qps-scale 3 --save out/features-conv.pkl
    python benchmarks/fidelity/cost_model_features.py \\
        --load out/features-conv.pkl out/features-code.pkl
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from executor.calibration.fit import fit_profile, profile_backend
from executor.calibration.interleave import measure_interleaved
from executor.calibration.validation import STEP_KINDS, compare, overall
from executor.loading import cpu_model
from executor.native import ROW_KNOTS
from sim.cost.calibrated import feature_names
from sim.engine.scheduler_config import POLICIES, SchedulerConfig

KNOTS = frozenset(feature_names(ROW_KNOTS)) - frozenset(feature_names())
VARIANTS = {  # name -> the features left out
    "all features": frozenset(),
    "no row knots": KNOTS,
    "no mixed-step cost": frozenset({"mixed_step"}),
    "no longest-KV term": frozenset({"decode_kv_max"}),
    "none of these": KNOTS | {"mixed_step", "decode_kv_max"},
}
CHUNK = STEP_KINDS[3]  # steps with a prefill chunk


def measure(args: argparse.Namespace) -> dict:
    """One sitting: the runs, the grid's plans and times, the speeds; as a picklable dict."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run_args import trace_and_model

    from executor.profile import GridProfile, row_knots

    trace, loaded = trace_and_model(args)
    backend, points, num_blocks, max_len = profile_backend(loaded, args.block_size,
                                                           args.kv_cache_gib, None)
    configs = {p: SchedulerConfig(policy=p, num_blocks=num_blocks, block_size=args.block_size,
                                  max_model_len=max_len) for p in POLICIES}
    profile = GridProfile(backend, points, args.seed)
    started = time.perf_counter()
    step_logs: dict[str, list] = {}
    runs, speeds, slowness = measure_interleaved(trace, configs, loaded.model, profile,
                                                 args.seed, step_logs=step_logs)
    return {"trace": trace, "configs": configs, "runs": runs, "speeds": speeds,
            "step_logs": step_logs,
            "plans": profile.plans, "times": profile.times, "slowness": slowness,
            "row_knots": row_knots(backend),
            "cpu": cpu_model(), "when": time.strftime("%Y-%m-%d %H:%M"),
            "seconds": time.perf_counter() - started}


def score(sitting: dict) -> list[tuple[str, float, float, float, float, float]]:
    """(variant, held-out median, held-out p90, validate median, validate max, in-run steps
    with a prefill chunk measured / predicted) per variant, then the full model at one
    speed for all runs."""
    trace, configs, runs = sitting["trace"], sitting["configs"], sitting["runs"]
    knots = sitting.get("row_knots", ROW_KNOTS)
    rows = []
    for name, without in VARIANTS.items():
        fit = fit_profile(sitting["plans"], sitting["times"], sitting["slowness"], knots,
                          without)
        results = compare(trace, configs, runs, fit.model, sitting["step_logs"],
                          sitting["speeds"])[0]
        result = overall(results)
        chunk = np.median([r["steps"][CHUNK]["median_ratio"] for r in results.values()
                           if CHUNK in r.get("steps", {})])
        rows.append((name, float(np.median(fit.held_error)),
                     float(np.percentile(fit.held_error, 90)),
                     result["median_abs_error"], result["max_abs_error"], float(chunk)))
    full = fit_profile(sitting["plans"], sitting["times"], sitting["slowness"], knots)
    result = overall(compare(trace, configs, runs, full.model)[0])
    rows.append(("all, one speed for all runs", float("nan"), float("nan"),
                 result["median_abs_error"], result["max_abs_error"], float("nan")))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", nargs="+", type=Path, default=None,
                        help="score sittings saved earlier instead of measuring one")
    parser.add_argument("--save", type=Path, default=None, help="keep this sitting (pickle)")
    if "--load" not in (argv if argv is not None else sys.argv[1:]):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from run_args import add_run_args

        add_run_args(parser)
    args = parser.parse_args(argv)
    if args.load:
        sittings = [pickle.loads(path.read_bytes()) for path in args.load]
    else:
        sittings = [measure(args)]
        if args.save is not None:
            args.save.parent.mkdir(parents=True, exist_ok=True)
            args.save.write_bytes(pickle.dumps(sittings[0]))
    scored = [score(sitting) for sitting in sittings]
    for sitting in sittings:
        print(f"{sitting['trace'].name}: {len(sitting['trace'])} requests, measured "
              f"{sitting['when']} on {sitting['cpu']} ({sitting['seconds']:.0f} s)")
    head = f"{'variant':<28}" + "".join(
        f"{'held-out p50/p90':>18}{'validate p50/max':>18}{'chunk steps':>12}" for _ in sittings)
    print(head)
    for i, (name, *_) in enumerate(scored[0]):
        cells = "".join(f"{_pair(rows[i][1], rows[i][2]):>18}{_pair(rows[i][3], rows[i][4]):>18}"
                        f"{'-' if np.isnan(rows[i][5]) else f'{rows[i][5]:.3f}':>12}"
                        for rows in scored)
        print(f"{name:<28}{cells}")
    medians = [statistics.median(rows[0][3] for rows in scored)]
    print(f"full model, median over sittings of validate's median |error|: {medians[0]:.1%}")
    return 0


def _pair(a: float, b: float) -> str:
    return "-" if np.isnan(a) else f"{a:.1%} / {b:.1%}"


if __name__ == "__main__":
    raise SystemExit(main())
