"""`servelab calibrate`: profile the executor (or probe a running server with --url), fit the
cost model, save it as JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from executor.calibration.fit import (
    calibration_meta,
    fit_profile,
    profile_backend,
    save_calibration,
)
from servelab.flag_types import add_hidden_alias
from servelab.model_args import (
    add_model_args,
    add_server_args,
    load_model_from_args,
    server_from_args,
)
from sim.specs.engine_limits import ENGINE_DEFAULTS


def register(subparsers: argparse._SubParsersAction) -> None:
    cal = subparsers.add_parser("calibrate", help="profile the executor, or probe a server, "
                                                  "and fit a cost model")
    add_model_args(cal)
    add_server_args(cal)
    cal.add_argument("--out", type=Path, required=True, help="calibration JSON to write")
    cal.add_argument("--block-size", type=int, default=ENGINE_DEFAULTS.block_size,
                     help="tokens per KV block")
    cal.add_argument("--max-model-len", type=int, default=None,
                     help="prompt+output limit per request (default: the model's)")
    cal.add_argument("--repeats", type=int, default=15,
                     help="timed rounds over the grid (median per shape)")
    cal.add_argument("--quick", action="store_true", help="a small grid (smoke tests)")
    limits = cal.add_argument_group("a server's limits, with --url (recorded in the file)")
    limits.add_argument("--max-num-seqs", type=int, default=ENGINE_DEFAULTS.max_num_seqs,
                        help="most running requests (vLLM's max_num_seqs; default "
                             f"{ENGINE_DEFAULTS.max_num_seqs}); the executor's grid "
                             "profiles no step of more sequences")
    add_hidden_alias(limits, "--token-budget", "token_budget", int)  # servelab's first name
    limits.add_argument("--max-num-batched-tokens", dest="token_budget",
                        type=int, default=ENGINE_DEFAULTS.token_budget,
                        help="most tokens per step (vLLM's max_num_batched_tokens)")
    limits.add_argument("--num-blocks", type=int, default=None,
                        help="KV pool in blocks, where /metrics does not publish it")
    cal.add_argument("--seed", type=int, default=0, help="random weights and prompt tokens")
    cal.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.url is not None:
        from servelab.server_calibration import UrlCalibration, calibrate_url

        return calibrate_url(UrlCalibration(
            server_from_args(args), args.out, args.max_num_seqs, args.token_budget,
            args.num_blocks, args.block_size, args.vocab_size, args.server_policy, args.quick,
            args.seed))
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    loaded = load_model_from_args(args)
    # Verify steps too: one calibration prices speculative runs (and, with the drafter's
    # passes below, a draft model) as well as plain ones.
    backend, points, num_blocks, max_len = profile_backend(
        loaded, args.block_size, args.kv_cache_gib, args.max_model_len, args.quick,
        speculative=True, max_num_seqs=args.max_num_seqs)
    from executor.profile import measure
    from executor.speculative.profile import profile_drafter_passes

    with tqdm(total=len(points) * (args.repeats + 1), unit="step", file=sys.stderr,
              leave=False, disable=None) as bar:
        plans, times = measure(backend, points, args.repeats, args.seed, bar.update)
    fit = fit_profile(plans, times, row_knots=backend.row_knots)
    meta = calibration_meta(loaded, args.block_size, args.kv_cache_gib, num_blocks, max_len,
                            len(points), len(times))
    # A draft model's passes, so a simulation can price one without its own calibration.
    meta["drafter_passes"] = profile_drafter_passes(backend, max_len, args.max_num_seqs,
                                                    seed=args.seed, quick=args.quick)
    save_calibration(fit, args.out, meta)
    print(f"profiled {len(points)} step shapes of {loaded.name} on {loaded.device} "
          f"({loaded.threads} threads, {loaded.kernels} kernels)")
    print(fit.describe())
    print(f"wrote {args.out}")
    return 0
