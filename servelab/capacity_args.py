"""Arguments of `bench-serve --find-capacity`: the SLO, the search's steps and budget, outputs."""

from __future__ import annotations

import argparse
from pathlib import Path

from servelab.bench_capacity import CapacityOptions
from servelab.sweeps.grid import CapacitySlo


def add_capacity_args(parser: argparse.ArgumentParser) -> None:
    """The capacity search's options."""
    cap = parser.add_argument_group(
        "capacity at SLO (--find-capacity)",
        "Replay the trace at rising rates (each --capacity-growth times the last) until p99 "
        "TTFT or p99 ITL breaks its target, then bisect; a stage stops early once its "
        "verdict is certain, and the search stops within --capacity-budget-s.")
    cap.add_argument("--find-capacity", action="store_true",
                     help="search the highest rate that holds the SLO")
    cap.add_argument("--slo-ttft-p99-ms", type=float, default=2000.0,
                     help="p99 TTFT target (default 2000)")
    cap.add_argument("--slo-itl-p99-ms", type=float, default=200.0,
                     help="p99 ITL target (default 200)")
    cap.add_argument("--capacity-start-rate", type=float, default=None,
                     help="first stage's rate in req/s (default: the trace's own)")
    cap.add_argument("--capacity-growth", type=float, default=2.0,
                     help="rate factor between stages until one breaks (default 2)")
    cap.add_argument("--capacity-tolerance", type=float, default=0.05,
                     help="stop bisecting once the broken rate is within this share of the "
                          "held one (default 0.05)")
    cap.add_argument("--capacity-budget-s", type=float, default=900.0,
                     help="the whole search's time limit in seconds (default 900)")
    cap.add_argument("--out", type=Path, default=None,
                     help="directory for the stage table (CSV) and latency_vs_load.png")


def capacity_options(args: argparse.Namespace) -> CapacityOptions:
    """The search the flags ask for."""
    return CapacityOptions(
        CapacitySlo(args.slo_ttft_p99_ms, args.slo_itl_p99_ms), args.capacity_start_rate,
        args.capacity_growth, args.capacity_tolerance, args.capacity_budget_s, args.vocab_size,
        args.seed, args.out, args.json)
