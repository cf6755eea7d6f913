"""`servelab validate`: one trace measured on the executor (or replayed against a running
server with --url) and simulated with a calibration.

Prints, per policy, the signed relative error (simulated - measured) / measured of each
metric, then how the cost model priced the steps the measured runs took, by kind.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from executor.calibration.fit import Fit, calibration_meta, profile_backend, save_calibration
from executor.calibration.interleave import measure_and_calibrate
from executor.calibration.validation import compare, measure_runs, overall
from servelab.model_args import (
    add_model_args,
    add_server_args,
    load_model_from_args,
    server_from_args,
)
from servelab.sim_args import (
    add_scheduler_args,
    parse_policies,
    scheduler_config,
    write_json_atomic,
)
from servelab.trace_args import OPEN_LOOP_HELP, add_rate_args, add_trace_args, load_trace_from_args
from servelab.validate_output import format_errors, format_overall, format_speeds, format_steps
from sim.cost.calibrated import CalibratedCostModel

if TYPE_CHECKING:
    from servelab.server_calibration import UrlValidation


def register(subparsers: argparse._SubParsersAction) -> None:
    val = subparsers.add_parser("validate", help="measured vs simulated on one trace")
    add_trace_args(val, positional=False)
    add_rate_args(val)
    val.add_argument("--open-loop", action="store_true", help=OPEN_LOOP_HELP)
    val.add_argument("--policies", default="static,continuous,recompute,chunked",
                     help="batching policies (default: all four)")
    cal = val.add_mutually_exclusive_group(required=True)
    # With --url, --cost-model is a calibration of that server (calibrate --url).
    cal.add_argument("--cost-model", type=Path, help="calibration JSON")
    cal.add_argument("--calibrate", type=Path, metavar="FILE",
                     help="calibrate while measuring instead: the profile grid timed a "
                          "shape at a time between the measured runs' steps, fitted and "
                          "written to FILE, so the calibration sees the machine the runs saw")
    val.add_argument("--repeats", type=int, default=1,
                     help="measured runs per policy, in A B .. B A order; medians are compared "
                          "and the runs' spread is printed as the machine's noise floor")
    add_scheduler_args(val)
    add_model_args(val)
    add_server_args(val)
    val.add_argument("--max-failed-share", type=float, default=0.05, metavar="SHARE",
                     help="with --url: the share of the replayed requests that may fail (no "
                          "complete answer; counted, left out of the measured metrics) before "
                          "validation stops with an error (default 0.05)")
    val.add_argument("--json", type=Path, default=None, help="write the result as JSON")
    val.add_argument("--out", type=Path, default=None, help="CDF overlays and error table")
    val.set_defaults(func=_run)


@dataclass
class Measured:
    """The measured runs and what simulates them: the cost model, and with --calibrate the
    fit, the profile it came from and each run's machine speed."""

    runs: dict
    cost_model: CalibratedCostModel
    step_logs: dict
    fit: Fit | None = None
    profile: object | None = None  # executor.profile.GridProfile
    speeds: dict | None = None  # per policy, how slow the machine ran each run


def _measure(args: argparse.Namespace, trace, loaded, configs: dict) -> Measured:
    """Run each policy on the executor (timing the grid in between with --calibrate)."""
    profile = None
    if args.calibrate is not None:
        from executor.profile import GridProfile

        backend, points, *_ = profile_backend(loaded, args.block_size, args.kv_cache_gib,
                                              args.max_model_len)
        profile = GridProfile(backend, points, args.seed)
    warm_up = 0 if profile is None else len(profile.points)  # interleaved shapes: not counted
    bar = tqdm(total=len(trace) * len(configs) * args.repeats + warm_up, file=sys.stderr,
               leave=False, disable=None)

    def on_step(_now: float, done: list) -> None:
        bar.update(len(done))

    step_logs: dict[str, list] = {}
    try:
        if profile is None:
            runs = measure_runs(trace, configs, loaded.model, args.seed, on_step, args.repeats,
                                step_logs=step_logs, open_loop=args.open_loop)
            return Measured(runs, CalibratedCostModel.load(args.cost_model), step_logs)
        runs, fit, speeds = measure_and_calibrate(
            trace, configs, loaded.model, profile, args.seed, on_step, lambda: bar.update(1),
            args.repeats, step_logs, args.open_loop)
    finally:
        bar.close()
    num_blocks = next(iter(configs.values())).num_blocks
    meta = calibration_meta(loaded, args.block_size, args.kv_cache_gib, num_blocks,
                            loaded.max_model_len(args.max_model_len), len(profile.points),
                            len(profile.times))
    model = save_calibration(fit, args.calibrate, meta)
    return Measured(runs, model, step_logs, fit, profile, speeds)


def _at_one_speed(trace, configs: dict, measured: Measured, open_loop: bool) -> dict | None:
    """The same runs simulated at the machine's usual speed throughout, not each run's own:
    what the run speeds buy (None without --calibrate)."""
    if measured.speeds is None:
        return None
    return overall(compare(trace, configs, measured.runs, measured.cost_model,
                           open_loop=open_loop)[0])


def _run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if not 0 <= args.max_failed_share <= 1:
        raise ValueError(f"--max-failed-share must be in [0, 1], got {args.max_failed_share}")
    if args.url is not None:
        from servelab.server_calibration import validate_url

        if args.open_loop:
            raise ValueError("--open-loop: not with --url (the replay sends a session's turn "
                             "after the previous answer, as bench-serve does)")
        options = _url_validation(args)
        return validate_url(options, load_trace_from_args(args))
    policies = parse_policies(args.policies)
    if args.cost_model is not None:
        CalibratedCostModel.load(args.cost_model)  # a bad file fails before any run
    trace = load_trace_from_args(args)
    loaded = load_model_from_args(args)
    num_blocks = loaded.kv_blocks(args.block_size, args.kv_cache_gib)
    max_len = loaded.max_model_len(args.max_model_len)
    configs = {p: scheduler_config(args, p, num_blocks, max_len,
                                   lambda gib: loaded.kv_blocks(args.block_size, gib))
               for p in policies}
    measured = _measure(args, trace, loaded, configs)
    results, runs = compare(trace, configs, measured.runs, measured.cost_model,
                            measured.step_logs, measured.speeds, args.open_loop)
    one_speed = _at_one_speed(trace, configs, measured, args.open_loop)
    run_speed = overall(results) if measured.speeds is not None else None
    source = args.cost_model or f"{args.calibrate} (calibrated during the measured runs)"
    print(f"trace {trace.name}: {len(trace)} requests; model {loaded.name} on {loaded.device} "
          f"({loaded.threads} threads); cost model {source}")
    _print(results, measured, one_speed)
    if args.out is not None:
        from servelab.reporting.charts.fidelity_charts import write_validation

        write_validation(args.out, trace.name, results, runs)
        print(f"wrote the fidelity charts and fidelity_errors.csv to {args.out}")
    if args.json is not None:
        write_json_atomic(args.json, {
            "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
            "config": {"model": loaded.name, "device": str(loaded.device),
                       "cost_model": str(args.cost_model or args.calibrate),
                       "calibrated_during_runs": measured.profile is not None,
                       "num_blocks": num_blocks},
            "results": results, "overall": overall(results), "repeats": args.repeats,
            "overall_at_run_speeds": run_speed, "overall_at_one_speed": one_speed,
        })
    return 0


def _print(results: dict, measured: Measured, one_speed: dict | None) -> None:
    if measured.profile is not None:
        print(measured.fit.describe())
        print(f"grid timings on the measured runs' own backends: {measured.profile.borrowed} "
              f"of {measured.profile.times.size}")
    print(format_errors(results))
    print(format_overall(results))
    if measured.speeds is not None:
        print(format_speeds(measured.speeds))
        print(f"simulated at one speed throughout instead: median |error| "
              f"{one_speed['median_abs_error']:.1%}, largest {one_speed['max_abs_error']:.1%}")
    if steps := format_steps(results):
        print(steps)


def _url_validation(args: argparse.Namespace) -> UrlValidation:
    """The server's calibration (--cost-model) and the scheduler it and the flags describe."""
    from servelab.server_calibration import UrlValidation

    if args.cost_model is None:
        raise ValueError("validate --url needs --cost-model (a calibration from calibrate --url)")
    model = CalibratedCostModel.load(args.cost_model)
    server = model.meta.get("server") or {}
    policy = server.get("policy") or args.server_policy
    num_blocks = args.num_blocks or server.get("num_blocks") or model.meta.get("num_blocks")
    if num_blocks is None:
        raise ValueError(f"{args.cost_model} does not record the server's KV pool: pass "
                         "--num-blocks")
    config = scheduler_config(args, policy, num_blocks,
                              server.get("max_model_len") or model.meta.get("max_model_len"),
                              server=server)
    return UrlValidation(server_from_args(args), model, args.cost_model, policy, config,
                         args.repeats, args.vocab_size, args.seed, args.max_failed_share,
                         args.out, args.json)
