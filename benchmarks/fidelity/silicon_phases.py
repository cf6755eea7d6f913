"""AIConfigurator's H100 silicon rows replayed with users in step and with users spread out.

    python benchmarks/fidelity/silicon_phases.py [--filter Llama] [--rounds 20] [--seed 0]

`servelab fidelity-gpu` starts every user of a row at once, as aiperf's profiling phase does,
and the replay's users then stay in step: users whose prompts shared a prefill step finish
together and send their next prompts together. This replays each row a second time with each
user's first request at a uniformly random time within one predicted request cycle (the
in-step replay's mean TTFT + (osl - 1) x TPOT), the other end of how a closed loop's users
can sit in time, and prints both side by side per model, TP and precision (signed median and
p90 |error| of mean TTFT and TPOT). Nothing is fitted: the spread start is a bound on the
load's timing, not a model of any run.
"""

from __future__ import annotations

import argparse

import numpy as np

from sim.measured.silicon import (
    MEASURED_ROUNDS,
    RowRefused,
    RowResult,
    error_table,
    measured_means,
    row_deployment,
    row_plan,
    run_closed_loop,
    simulate_row,
)
from sim.measured.silicon_rows import SiliconRow, load_rows


def spread_replay(row: SiliconRow, in_step: RowResult, rounds: int,
                  rng: np.random.Generator) -> RowResult:
    """`row` replayed with its users' first requests spread over one predicted cycle."""
    if not in_step.simulated:
        return in_step
    cycle_s = (in_step.ttft_ms + (row.osl - 1) * in_step.tpot_ms) * 1e-3
    try:
        model, plan = row_plan(row, rounds)
        deployment = row_deployment(model, plan, vllm_version=row.engine_version)
        first_send_s = sorted(rng.uniform(0.0, cycle_s, plan.users))
        ttft_ms, tpot_ms = measured_means(run_closed_loop(plan, deployment, first_send_s))
    except RowRefused as refusal:
        return RowResult(row, None, None, str(refusal))
    return RowResult(row, ttft_ms, tpot_ms)


def _cell(group: dict, metric: str) -> str:
    median, p90 = group[f"{metric}_median"], group[f"{metric}_p90_abs"]
    return "-" if median is None else f"{median:+.0%} / {p90:.0%}"


def format_side_by_side(in_step: list[dict], spread: list[dict]) -> str:
    """One line per group: TTFT and TPOT, signed median / p90 |error|, in step then spread."""
    out = [f"{'model':<24}{'TP':>3} {'precision':<10}{'rows':>5}"
           f"{'TTFT in step':>16}{'TTFT spread':>16}{'TPOT in step':>16}{'TPOT spread':>16}"]
    for a, b in zip(in_step, spread, strict=True):
        cells = [_cell(group, metric) for metric in ("ttft", "tpot") for group in (a, b)]
        out.append(f"{a['model'].split('/')[-1]:<24}{a['tp']!s:>3} {a['precision']:<10}"
                   f"{a['simulated']:>5}" + "".join(f"{c:>16}" for c in cells))
    return "\n".join(out)


def format_rows(in_step: list[RowResult], spread: list[RowResult]) -> str:
    """One line per simulated row: measured mean TTFT, then each replay's and its error."""
    out = []
    for a, b in zip(in_step, spread, strict=True):
        if a.simulated and b.simulated:
            row = a.row
            out.append(f"{row.model.split('/')[-1]:<16} tp{row.tp} {row.isl}x{row.osl} "
                       f"u{row.batch_size * row.attention_dp:<4} TTFT {row.ttft_ms:9.1f} ms  "
                       f"in step {a.ttft_ms:9.1f} ({a.ttft_error:+5.0%})  "
                       f"spread {b.ttft_ms:9.1f} ({b.ttft_error:+5.0%})")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default="", help="only rows whose id contains this")
    parser.add_argument("--rounds", type=int, default=MEASURED_ROUNDS,
                        help="measured rounds of users per row (default: as measured)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the spread start")
    parser.add_argument("--rows", action="store_true", help="also print every row")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = [row for row in load_rows() if args.filter.lower() in row.row_id.lower()]
    if not rows:
        parser.error(f"no row id contains {args.filter!r}")
    in_step = [simulate_row(row, args.rounds) for row in rows]
    spread = [spread_replay(row, result, args.rounds, rng)
              for row, result in zip(rows, in_step, strict=True)]
    if args.rows:
        print(format_rows(in_step, spread))
    print(f"{len(rows)} rows, {args.rounds} measured rounds each; signed median / p90 |error|")
    print(format_side_by_side(error_table(in_step), error_table(spread)))


if __name__ == "__main__":
    main()
