"""A sweep grid for a capacity search: each configuration's rates run from the lowest up,
until one misses the SLO.

More load only adds latency, so a configuration that misses the SLO at a rate misses it at
every higher one: those rates are not run (the slowest runs of a sweep, whose queues grow
for the whole trace), and their rows say which rate failed instead of carrying numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

from sweeps.grid import CapacitySlo, Runner, SweepContext, SweepPoint, point_row


def rows_until_failing(runner: Runner, context: SweepContext, points: Sequence[SweepPoint],
                       slo: CapacitySlo) -> list[dict]:
    """The rows of `points`, in their order: each configuration's rates run lowest first
    (one round per rate, every configuration still holding in it) up to the first that
    misses slo; the rates above it get a not_run row (not_run_row)."""
    rates: dict[tuple, list[int]] = {}  # configuration -> its points' indices, lowest first
    for i, point in enumerate(points):
        rates.setdefault(point.config_key, []).append(i)
    pending = [sorted(idx, key=lambda i: points[i].qps_scale) for idx in rates.values()]
    rows: list[dict | None] = [None] * len(points)
    while pending:
        wave = [idx[0] for idx in pending]
        for i, row in zip(wave, runner([points[i] for i in wave]), strict=True):
            rows[i] = row
        still = []
        for first, *rest in pending:
            if slo.met(rows[first]):
                if rest:
                    still.append(rest)
                continue
            for i in rest:
                rows[i] = not_run_row(context, points[i], rows[first]["qps_scale"])
        pending = still
    return rows


def not_run_row(context: SweepContext, point: SweepPoint, failed_at: float) -> dict:
    """The row of a point not run because its configuration fails at a lower rate: the point,
    its limits and rate, and `not_run` (why) in place of a summary."""
    return {**point_row(context, point),
            "not_run": f"not run (fails at lower rate {failed_at:g}x)"}


def was_run(row: dict) -> bool:
    """Whether a sweep row carries a run's summary (not a not_run_row; in a table, the
    not_run of a row that ran is missing)."""
    return not isinstance(row.get("not_run"), str)
