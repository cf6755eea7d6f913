"""Fitting the calibrated cost model to a profile: held-out error, features left out, knots."""

from __future__ import annotations

import numpy as np
import pytest

from executor.calibration.fit import HOLDOUT_FOLDS, fit_profile
from sim.cost.calibrated import FEATURES, feature_names
from sim.engine.core import BatchPlan

KNOTS = (1, 2, 4, 8)


def _decode(rows: int, kv: int) -> BatchPlan:
    return BatchPlan(decode_seqs=rows, num_sampled=rows, decode_context=rows * kv,
                     decode_context_max=kv)


def _profile(outlier: int | None = None) -> tuple[list[BatchPlan], np.ndarray]:
    """Decode shapes timed in three rounds, priced by a known linear model."""
    rng = np.random.default_rng(0)
    plans = [_decode(rows, kv) for rows in (1, 2, 3, 4, 6, 8, 12, 16) for kv in (32, 256, 1024)]
    seconds = np.array([2e-3 + 1e-4 * p.decode_seqs + 2e-7 * p.decode_context
                        + 1e-6 * p.decode_context_max for p in plans])
    if outlier is not None:
        seconds[outlier] *= 3.0
    return plans, seconds * rng.normal(1.0, 0.002, (3, len(plans)))


def test_every_shape_is_predicted_by_a_fit_that_did_not_see_it():
    plans, times = _profile()
    fit = fit_profile(plans, times, row_knots=KNOTS)
    assert len(fit.held_error) == len(plans) and HOLDOUT_FOLDS > 1
    assert np.median(fit.held_error) < 0.01 and np.median(fit.fit_error) < 0.01
    assert fit.model.row_knots == KNOTS and len(fit.model.coefficients) == len(
        feature_names(KNOTS))
    # A shape three times as slow as the model: the fit that predicts it never saw it, so its
    # held-out error is the whole gap, while the final fit, which saw it, splits the blame.
    plans, times = _profile(outlier=7)
    fit = fit_profile(plans, times, row_knots=KNOTS)
    assert fit.held_error[7] > 0.6 and fit.fit_error[7] < fit.held_error[7]


def test_a_feature_left_out_gets_no_coefficient():
    plans, times = _profile()
    full = fit_profile(plans, times)
    assert dict(zip(FEATURES, full.model.coefficients, strict=True))["decode_kv_max"] > 0
    fit = fit_profile(plans, times, without=frozenset({"decode_kv_max"}))
    assert dict(zip(FEATURES, fit.model.coefficients, strict=True))["decode_kv_max"] == 0.0
    assert np.median(fit.held_error) > np.median(full.held_error)
    with pytest.raises(ValueError, match="no such cost-model features: knee"):
        fit_profile(plans, times, without=frozenset({"knee"}))
