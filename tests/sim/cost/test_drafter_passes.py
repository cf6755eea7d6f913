"""A drafter on an executor calibration: its passes priced from the calibration's drafter
passes (first layer and all layers profiled), linear in layers; what it cannot price is named."""

from __future__ import annotations

import pytest

from sim.cost.calibrated import CalibratedCostModel, feature_names
from sim.cost.drafter import DrafterCostError, calibrated_drafter, decode_plan, pass_model
from sim.engine.batch_plan import add_verify
from sim.engine.core import BatchPlan, Request
from sim.engine.speculation.config import SpeculativeConfig

KNOTS = (1, 4)


def _fit(per_row_s: float, fixed_s: float) -> dict[str, float]:
    values = dict.fromkeys(feature_names(KNOTS), 0.0)
    values.update(constant=fixed_s, sampled=per_row_s)
    return values


def _calibration(model: str = "tiny") -> CalibratedCostModel:
    record = {"target_layers": 2, "row_knots": list(KNOTS),
              "layers": {"1": {"first": _fit(1e-5, 2e-4), "later": _fit(1e-5, 1e-4)},
                         "2": {"first": _fit(3e-5, 3e-4), "later": _fit(2e-5, 2e-4)}}}
    return CalibratedCostModel(tuple(1e-4 for _ in feature_names()),
                               meta={"model": model, "drafter_passes": record})


def test_pass_model_is_linear_in_layers_between_the_profiled_depths():
    record = _calibration().meta["drafter_passes"]
    plan = decode_plan([100] * 4)
    one = pass_model(record, 1, "first").predict(plan)
    two = pass_model(record, 2, "first").predict(plan)
    assert one == pytest.approx(2e-4 + 4 * 1e-5) and two == pytest.approx(3e-4 + 4 * 3e-5)
    assert pass_model(record, 3, "first").predict(plan) == pytest.approx(two + (two - one))
    assert pass_model(record, 2, "later").predict(plan) == pytest.approx(2e-4 + 4 * 2e-5)


@pytest.mark.parametrize("config, depth", [
    ({"draft_num_layers": 1}, 1), ({"model": "tiny"}, 2)])
def test_a_drafter_of_the_targets_width_is_priced_by_its_layers(config, depth):
    spec = SpeculativeConfig(method="draft_model", **config)
    drafter = calibrated_drafter(spec, _calibration())
    record = _calibration().meta["drafter_passes"]
    assert drafter.model == pass_model(record, depth, "first")
    assert drafter.later == pass_model(record, depth, "later")
    assert f"{depth} of the target's 2 layers" in drafter.description


@pytest.mark.parametrize("config, match", [
    ({"draft_num_layers": 3}, "has 2 layers"),
    ({"model": "peer-45m"}, "not the calibrated tiny's shape"),
])
def test_what_a_calibration_cannot_price_is_named(config, match):
    with pytest.raises(DrafterCostError, match=match):
        calibrated_drafter(SpeculativeConfig(method="draft_model", **config), _calibration())
    no_passes = CalibratedCostModel(tuple(1e-4 for _ in feature_names()), meta={})
    with pytest.raises(DrafterCostError, match="no drafter passes"):
        calibrated_drafter(SpeculativeConfig(method="draft_model", **config), no_passes)


def test_the_first_pass_computes_what_the_executors_drafter_has_not():
    """A row's first verify catches its whole sequence up; after accepting a < k proposals
    one token, after accepting all k two; a finished request's KV is forgotten."""
    drafter = calibrated_drafter(SpeculativeConfig(method="draft_model", draft_num_layers=1),
                                 _calibration())
    row = Request("r", 0.0, 10, 20)
    row.num_computed_tokens = 9  # prompt of 10 tokens done but the last
    assert _first_pass_tokens(drafter, row, k=3) == 10
    row.token_times_s = [0.0] * 2  # accepted 1 of 3, plus the target's token
    row.num_computed_tokens = 11
    assert _first_pass_tokens(drafter, row, k=3) == 1
    row.token_times_s += [0.0] * 4  # accepted all 3, plus the target's token
    row.num_computed_tokens = 15
    assert _first_pass_tokens(drafter, row, k=3) == 2
    drafter.free(row)
    assert _first_pass_tokens(drafter, row, k=3) == 16


def _first_pass_tokens(drafter, row: Request, k: int) -> int:
    plan = BatchPlan()
    add_verify(plan, row, k, ())
    first = drafter.kv.first_pass(plan)
    return first.prefill_tokens + first.decode_seqs
