"""The fitted cost model: recovers known coefficients, round-trips JSON, rejects bad files."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from sim.cost.calibrated import (
    FEATURES,
    CalibratedCostModel,
    feature_names,
    fit_coefficients,
    knot_weights,
    plan_features,
    step_jitter,
)
from sim.engine.batch_plan import add_decodes, add_padding, add_to_plan
from sim.engine.core import BatchPlan, Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig

KNOTS = (1, 2, 4, 8, 16)  # any increasing rows: a calibration brings its kernels' own
NAMES = feature_names(KNOTS)


def test_fit_recovers_known_coefficients_from_noisy_steps():
    rng = np.random.default_rng(0)
    n = 3000  # enough steps at each sampled-rows knot to pin its fixed cost
    knot_costs = [0.0, 2e-4, 5e-4, 9e-4, 3e-3]  # decode-only fixed cost by rows with logits
    true = np.array([2e-3, 4e-3, 5e-5, 3e-4, 1e-5, 2e-8, 4e-8, 5e-7, 1e-9, 3e-9, 0.0, 1e-3,
                     *knot_costs])
    prefill = rng.integers(0, 2, n)
    x = np.column_stack([np.ones(n), prefill]
                        + [rng.uniform(0, s, n)
                           for s in (2000, 64, 64, 5e4, 1e5, 2000, 1e6, 1e6, 1e6)])
    sampled = np.where(rng.random(n) < 0.5, rng.integers(1, 10, n), rng.integers(1, 40, n))
    hats = [knot_weights(s, KNOTS) if not p else [0.0] * len(KNOTS)
            for s, p in zip(sampled, prefill, strict=True)]
    mixed = prefill * (rng.random(n) < 0.5)  # half the prefill steps carry decodes as well
    x = np.column_stack([x, mixed, np.asarray(hats)])
    y = x @ true * rng.normal(1.0, 0.01, n)
    fitted = fit_coefficients(x, y)
    assert np.all(fitted >= 0)
    rel = np.abs(x @ fitted - y) / y
    assert np.median(rel) < 0.01
    assert fitted[2:5] == pytest.approx(true[2:5], rel=0.1)  # per row and per sequence
    # The fixed costs (the constant and the knots share theirs, so only sums are
    # identifiable): a prefill step's, alone and with decodes, and a decode step's at each knot.
    assert fitted[0] + fitted[1] == pytest.approx(true[0] + true[1], rel=0.1)
    mixed_fixed = [0, 1, NAMES.index("mixed_step")]
    assert fitted[mixed_fixed].sum() == pytest.approx(true[mixed_fixed].sum(), rel=0.1)
    for k in KNOTS:
        at = np.zeros(len(NAMES))
        at[0] = 1.0
        at[len(FEATURES):] = knot_weights(k, KNOTS)
        assert at @ fitted == pytest.approx(at @ true, rel=0.1), k


def test_decode_steps_pay_a_fixed_cost_by_their_sampled_rows():
    weights = knot_weights(3, KNOTS)  # halfway between the knots at 2 and 4
    assert weights[KNOTS.index(2)] == weights[KNOTS.index(4)] == 0.5
    assert knot_weights(500, KNOTS) == [0.0] * (len(KNOTS) - 1) + [1.0]
    assert knot_weights(0, KNOTS) == [0.0] * len(KNOTS)
    for rows in range(1, 40):
        assert sum(knot_weights(rows, KNOTS)) == pytest.approx(1.0)
    plan = BatchPlan()
    add_decodes(plan, [_running(f"d{i}", 10) for i in range(8)])
    f = dict(zip(NAMES, plan_features(plan, KNOTS), strict=True))
    assert f["decode_sampled_8"] == 1.0 and f["prefill_step"] == f["mixed_step"] == 0.0
    assert len(plan_features(plan)) == len(FEATURES)  # no knots, no knot features
    add_to_plan(plan, Request("p", 0.0, 20, 4), 20)  # a prefill chunk joins: not decode-only
    f = dict(zip(NAMES, plan_features(plan, KNOTS), strict=True))
    assert all(f[f"decode_sampled_{k}"] == 0.0 for k in KNOTS)
    assert f["prefill_step"] == f["mixed_step"] == 1.0


def test_static_padding_rows_are_computed_but_sample_nothing():
    plan = BatchPlan()
    add_decodes(plan, [_running(f"d{i}", 10) for i in range(4)])
    for i in range(20):  # finished rows of a static batch: computed, no logits
        add_padding(plan, _running(f"f{i}", 12))
    f = dict(zip(NAMES, plan_features(plan, KNOTS), strict=True))
    assert f["tokens"] == 24 and f["sampled"] == 4 and f["decode_sampled_4"] == 1.0
    # A model whose lm_head costs 1 ms a tile prices the 24-row step as 4 sampled rows.
    head = np.array([1e-3 if name.startswith("decode_sampled_") else 0.0 for name in NAMES])
    assert CalibratedCostModel(tuple(head), KNOTS).predict(plan) == pytest.approx(1e-3)


def _running(request_id: str, computed: int) -> Request:
    request = Request(request_id, 0.0, computed, 8)
    request.num_computed_tokens = computed
    return request


def test_features_follow_the_plan_totals():
    sched = Scheduler(SchedulerConfig(policy="chunked", num_blocks=64, max_model_len=512,
                                      token_budget=32, max_num_seqs=4))
    sched.add(Request("a", 0.0, 40, 4))
    plan = sched.schedule(0.0)
    f = dict(zip(FEATURES, plan_features(plan), strict=True))
    assert f["tokens"] == 32 and f["sampled"] == 0 and f["seqs"] == 1 and f["prefill_step"] == 1
    assert f["mixed_step"] == 0  # a chunk alone
    assert f["prefill_attn"] == 32 * 32 and f["prefill_attn_padded"] == 32 * 32
    assert f["prefill_attn_causal"] == 32 * 33 // 2  # query i sees keys 0..i


def test_decode_features_see_the_longest_row_as_well_as_the_sum():
    plan = BatchPlan()
    short, long = Request("s", 0.0, 4, 8), Request("l", 0.0, 12, 8)
    short.num_computed_tokens, long.num_computed_tokens = 4, 12
    add_decodes(plan, [short, long])
    f = dict(zip(FEATURES, plan_features(plan), strict=True))
    assert (f["decode_kv"], f["decode_kv_max"], f["decode_kv_padded"]) == (18, 13, 26)
    assert f["prefill_step"] == 0  # decodes only


def test_predict_saves_and_loads(tmp_path):
    model = CalibratedCostModel(tuple(float(i) * 1e-4 for i in range(len(NAMES))), KNOTS,
                                meta={"model": "tiny"})
    plan = BatchPlan(requests=[Request("a", 0.0, 4, 4)], decode_seqs=1, num_sampled=1,
                     decode_context=5, decode_context_max=5)
    path = tmp_path / "cal.json"
    model.save(path)
    loaded = CalibratedCostModel.load(path)
    assert loaded.predict(plan) == model.predict(plan) > 0
    assert loaded.meta == {"model": "tiny"} and loaded.row_knots == KNOTS
    assert model.predict(BatchPlan()) == 0.0


def test_row_knots_must_increase():
    coefficients = (0.0,) * (len(FEATURES) + 2)
    for knots in ((2, 2), (0, 4), (4, 2)):
        with pytest.raises(ValueError, match="row knots"):
            CalibratedCostModel(coefficients, knots)
    with pytest.raises(ValueError, match="coefficients"):
        CalibratedCostModel(coefficients, (1, 2, 4))


@pytest.mark.parametrize(
    ("content", "needle"),
    [("not json", "not a servelab calibration"), (json.dumps({"meta": {}}), "calibration"),
     (json.dumps({"features": {"constant": 1.0}}), "lacks features"),
     (json.dumps({"features": {name: "x" for name in FEATURES}}), "numbers"),
     (json.dumps({"features": {name: -1.0 for name in FEATURES}}), ">= 0"),
     (json.dumps({"features": {"decode_rows_6": 1.0, **{name: 1.0 for name in FEATURES}}}),
      "does not price .decode_rows_6."),
     (json.dumps({"features": {name: 1.0 for name in FEATURES}, "row_knots": ["x"]}),
      "row knots"),
     (json.dumps({"features": {name: 1.0 for name in FEATURES}, "row_knots": [4, 2]}),
      "row knots must be increasing")],
)
def test_bad_calibration_file_names_the_file(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=needle):
        CalibratedCostModel.load(path)


def _decode_plan(request_id: str, computed: int) -> BatchPlan:
    request = Request(request_id, 0.0, computed, 4)
    request.num_computed_tokens = computed
    return BatchPlan(requests=[request], decode_seqs=1, num_sampled=1,
                     decode_context=computed + 1, decode_context_max=computed + 1)


def test_step_jitter_scales_steps_by_the_profiled_spread_reproducibly(tmp_path):
    rng = np.random.default_rng(0)
    medians = rng.uniform(1e-3, 1e-1, 50)
    times = medians * rng.lognormal(0.0, 0.1, (9, 50))
    times[0, 0] *= 30  # a lone stall stays out of the quantiles
    jitter = step_jitter(times)
    assert list(jitter) == sorted(jitter) and 0.7 < jitter[0] < 1 < jitter[-1] < 1.5
    base = CalibratedCostModel((1e-3,) + (0.0,) * (len(FEATURES) - 1))
    model = CalibratedCostModel(base.coefficients, jitter=jitter)
    plans = [_decode_plan(f"r{i}", 10 + i) for i in range(400)]
    factors = np.array([model.execute(p).duration_s / base.execute(p).duration_s
                        for p in plans])
    assert jitter[0] <= factors.min() and factors.max() <= jitter[-1]
    assert np.median(factors) == pytest.approx(1.0, abs=0.03)  # the median step is the fit
    assert factors.mean() > 1.0  # ...and the mean carries the right-skewed spread
    again = [model.execute(p).duration_s for p in plans]
    assert np.allclose(again, factors * 1e-3)  # the same plan, the same draw
    other = [replace(model, jitter_seed=1).execute(p).duration_s for p in plans]
    assert not np.allclose(other, again)  # another seed, another run
    path = tmp_path / "cal.json"
    model.save(path)
    loaded = CalibratedCostModel.load(path)
    assert [loaded.execute(p).duration_s for p in plans] == again


def test_a_calibration_from_before_the_later_features_loads(tmp_path):
    path = tmp_path / "cal.json"
    later = ("prefill_attn_causal", "decode_kv_max")
    features = {name: 1e-3 for name in FEATURES if name not in later}
    path.write_text(json.dumps({"features": features}))
    model = CalibratedCostModel.load(path)
    coefficients = dict(zip(FEATURES, model.coefficients, strict=True))
    assert [coefficients[name] for name in later] == [0.0, 0.0]


def test_bad_jitter_is_refused(tmp_path):
    path = tmp_path / "cal.json"
    payload = {"features": {name: 0.0 for name in FEATURES}, "jitter": [1.2, 0.9]}
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="non-decreasing"):
        CalibratedCostModel.load(path)
    with pytest.raises(ValueError, match=">= 2 runs"):
        step_jitter(np.ones((1, 5)))
