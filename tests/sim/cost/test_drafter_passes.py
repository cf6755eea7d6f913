"""A drafter on an executor calibration: its passes priced from the calibration's drafter
passes (first layer and all layers profiled), linear in layers; what it cannot price is named."""

from __future__ import annotations

import pytest

from sim.cost.calibrated import CalibratedCostModel, feature_names
from sim.cost.drafter import DrafterCostError, calibrated_drafter, decode_plan, pass_model
from sim.engine.speculation.config import SpeculativeConfig

KNOTS = (1, 4)


def _fit(per_row_s: float, fixed_s: float) -> dict[str, float]:
    values = dict.fromkeys(feature_names(KNOTS), 0.0)
    values.update(constant=fixed_s, sampled=per_row_s)
    return values


def _calibration(model: str = "tiny") -> CalibratedCostModel:
    record = {"target_layers": 2, "row_knots": list(KNOTS),
              "layers": {"1": _fit(1e-5, 2e-4), "2": _fit(3e-5, 3e-4)}}
    return CalibratedCostModel(tuple(1e-4 for _ in feature_names()),
                               meta={"model": model, "drafter_passes": record})


def test_pass_model_is_linear_in_layers_between_the_profiled_depths():
    record = _calibration().meta["drafter_passes"]
    plan = decode_plan([100] * 4)
    one, two = pass_model(record, 1).predict(plan), pass_model(record, 2).predict(plan)
    assert one == pytest.approx(2e-4 + 4 * 1e-5) and two == pytest.approx(3e-4 + 4 * 3e-5)
    assert pass_model(record, 3).predict(plan) == pytest.approx(two + (two - one))


@pytest.mark.parametrize("config, depth", [
    ({"draft_num_layers": 1}, 1), ({"model": "tiny"}, 2)])
def test_a_drafter_of_the_targets_width_is_priced_by_its_layers(config, depth):
    spec = SpeculativeConfig(method="draft_model", **config)
    drafter = calibrated_drafter(spec, _calibration())
    record = _calibration().meta["drafter_passes"]
    assert drafter.model == pass_model(record, depth)
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
