"""The fitted cost model: recovers known coefficients, round-trips JSON, rejects bad files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.calibrated import FEATURES, CalibratedCostModel, fit_coefficients, plan_features
from sim.core import BatchPlan, Request
from sim.scheduler import Scheduler, SchedulerConfig


def test_fit_recovers_known_coefficients_from_noisy_steps():
    rng = np.random.default_rng(0)
    true = np.array([2e-3, 5e-5, 3e-4, 1e-5, 2e-8, 4e-8, 1e-9, 0.0])
    x = np.column_stack([np.ones(400)] + [rng.uniform(0, s, 400) for s in
                                          (2000, 64, 64, 5e4, 1e5, 1e6, 1e6)])
    y = x @ true * rng.normal(1.0, 0.01, 400)
    fitted = fit_coefficients(x, y)
    assert np.all(fitted >= 0)
    rel = np.abs(x @ fitted - y) / y
    assert np.median(rel) < 0.01
    assert fitted[0] == pytest.approx(true[0], rel=0.1)
    assert fitted[1] == pytest.approx(true[1], rel=0.1)


def test_features_follow_the_plan_totals():
    sched = Scheduler(SchedulerConfig(policy="chunked", num_blocks=64, max_model_len=512,
                                      token_budget=32, max_num_seqs=4))
    sched.add(Request("a", 0.0, 40, 4))
    plan = sched.schedule(0.0)
    f = dict(zip(FEATURES, plan_features(plan), strict=True))
    assert f["tokens"] == 32 and f["sampled"] == 0 and f["seqs"] == 1
    assert f["prefill_attn"] == 32 * 32 and f["prefill_attn_padded"] == 32 * 32


def test_predict_saves_and_loads(tmp_path):
    model = CalibratedCostModel(tuple(float(i) * 1e-4 for i in range(len(FEATURES))),
                                {"model": "tiny"})
    plan = BatchPlan(requests=[Request("a", 0.0, 4, 4)], decode_seqs=1, num_sampled=1,
                     decode_context=5, decode_context_max=5)
    path = tmp_path / "cal.json"
    model.save(path)
    loaded = CalibratedCostModel.load(path)
    assert loaded.predict(plan) == model.predict(plan) > 0
    assert loaded.meta == {"model": "tiny"}
    assert model.predict(BatchPlan()) == 0.0


@pytest.mark.parametrize(
    ("content", "needle"),
    [("not json", "not a servelab calibration"), (json.dumps({"meta": {}}), "calibration"),
     (json.dumps({"features": {"constant": 1.0}}), "lacks features"),
     (json.dumps({"features": {name: "x" for name in FEATURES}}), "numbers"),
     (json.dumps({"features": {name: -1.0 for name in FEATURES}}), ">= 0")],
)
def test_bad_calibration_file_names_the_file(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=needle):
        CalibratedCostModel.load(path)
