"""Fitting the calibrated cost model: the KV knee."""

from __future__ import annotations

import numpy as np

from calibration.fit import choose_knee
from sim.core import BatchPlan


def test_calibrate_picks_the_knee_where_kv_gets_dearer():
    rng = np.random.default_rng(1)
    plans, durations = [], []
    for rows in (1, 2, 4, 8, 16, 32, 64):
        for kv in (32, 256, 1024, 1792):
            plan = BatchPlan(decode_seqs=rows, num_sampled=rows, decode_context=rows * kv,
                             decode_context_max=kv)
            total = rows * kv
            seconds = 5e-3 + 1e-4 * rows + 2e-7 * total + 1e-6 * max(0, total - 8192)
            plans.append(plan)
            durations.append(seconds * rng.normal(1.0, 0.005))
    durations = np.asarray(durations)
    assert choose_knee(plans, durations, np.ones(len(plans), dtype=bool)) == 8192
    flat = np.asarray([5e-3 + 2e-7 * p.decode_context for p in plans])
    assert choose_knee(plans, flat, np.ones(len(plans), dtype=bool)) == np.inf
