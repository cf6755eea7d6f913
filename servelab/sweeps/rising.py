"""A sweep grid for a capacity search: each configuration's rates run from the lowest up,
until one misses the SLO, then its capacity bisected.

More load only adds latency, so a configuration that misses the SLO at a rate misses it at
every higher one: those rates are not run (the slowest runs of a sweep, whose queues grow
for the whole trace), and their rows say which rate failed instead of carrying numbers.
The grid's rows then decide every bisection probe they imply (servelab.sweeps.grid.find_capacity).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from servelab.sweeps.grid import (
    REL_TOL,
    Capacity,
    CapacitySlo,
    SweepContext,
    SweepPoint,
    bisect_rate,
    check_range,
    point_row,
    rate_rps,
)
from servelab.sweeps.stream import Search, as_stream, drive


def sweep_capacity(runner, context: SweepContext, points: Sequence[SweepPoint],
                   slo: CapacitySlo, low: float, high: float
                   ) -> tuple[list[dict], list[Capacity]]:
    """The rows of `points` (in their order) and each configuration's capacity (in the
    order of its first point): a configuration's rates run lowest first up to the first
    that misses slo (the rates above it get a not_run_row), then its bisection in [low,
    high], each probe stopped once it certainly fails. Configurations go side by side,
    each worker of the runner starting a run as soon as it is free."""
    check_range(low, high)
    configs: dict[tuple, list[int]] = {}  # configuration -> its points' indices
    for i, point in enumerate(points):
        configs.setdefault(point.config_key, []).append(i)
    stream = as_stream(runner)
    found = drive(stream, [_search(context, [points[i] for i in idx], slo, low, high)
                           for idx in configs.values()], stream.slots)
    rows: list[dict] = [{}] * len(points)
    for idx, (config_rows, _) in zip(configs.values(), found, strict=True):
        for i, row in zip(idx, config_rows, strict=True):
            rows[i] = row
    return rows, [capacity for _, capacity in found]


def _search(context: SweepContext, points: list[SweepPoint], slo: CapacitySlo, low: float,
            high: float) -> Search:
    """One configuration's rising rates, then its bisection: (its rows in the order of
    points, its capacity)."""
    order = sorted(range(len(points)), key=lambda i: points[i].qps_scale)
    rows: list[dict] = [{}] * len(points)
    failed_at = None
    for i in order:
        if failed_at is not None:
            rows[i] = not_run_row(context, points[i], failed_at)
            continue
        (rows[i],) = yield [points[i]]
        if not slo.met(rows[i]):
            failed_at = points[i].qps_scale
    config = replace(points[0], verdict=slo)
    capacity = yield from bisect_rate(config, slo, low, high, REL_TOL,
                                      [row for row in rows if was_run(row)],
                                      partial(rate_rps, context.trace))
    return rows, capacity


def not_run_row(context: SweepContext, point: SweepPoint, failed_at: float) -> dict:
    """The row of a point not run because its configuration fails at a lower rate: the point,
    its limits and rate, and `not_run` (why) in place of a summary."""
    return {**point_row(context, point),
            "not_run": f"not run (fails at lower rate {failed_at:g}x)"}


def was_run(row: dict) -> bool:
    """Whether a sweep row carries a run's summary (not a not_run_row; in a table, the
    not_run of a row that ran is missing)."""
    return not isinstance(row.get("not_run"), str)
