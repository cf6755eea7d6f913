"""`servelab simulate --speculative-config`: the verify step priced by the cost model, the
acceptance its rate vector implies, and the speedup over the same replay without it."""

from __future__ import annotations

import json

from servelab.cli import main

TRACE = "synthetic:n=60,rate=4,prompt=uniform(100,400),output=uniform(50,200)"
SPEC = ('{"method": "ngram", "num_speculative_tokens": 3, '
        '"acceptance_rates": [0.8, 0.6, 0.4]}')


def test_simulate_reports_acceptance_and_a_tpot_speedup(tmp_path, capsys):
    saved = tmp_path / "sim.json"
    code = main(["simulate", "--trace", TRACE, "--speculative-config", SPEC,
                 "--json", str(saved)])
    assert code == 0, capsys.readouterr().err
    assert "speculation: acceptance rate 0.600, mean accepted length 2.80" in (
        capsys.readouterr().out)
    result = json.loads(saved.read_text())["results"]["continuous"]
    assert result["spec_tpot_speedup"] > 1.0  # a memory-bound decode verifies 4 tokens ~free


def test_simulate_without_acceptance_rates_is_one_clear_error(capsys):
    code = main(["simulate", "--trace", TRACE, "--speculative-config", '{"method": "ngram"}'])
    assert code != 0
    assert "acceptance_rates" in capsys.readouterr().err


def _speedup(tmp_path, capsys, spec: str) -> float:
    saved = tmp_path / "sim.json"
    code = main(["simulate", "--trace", TRACE, "--speculative-config", spec,
                 "--json", str(saved)])
    assert code == 0, capsys.readouterr().err
    return json.loads(saved.read_text())["results"]["continuous"]["spec_tpot_speedup"]


def test_a_drafter_is_priced_and_costs_speedup(tmp_path, capsys):
    """EAGLE, MTP and a draft model's passes are added to each step: the same acceptance
    gains less than n-gram's free proposals, and a bigger drafter less than a head."""
    rates = '"num_speculative_tokens": 3, "acceptance_rates": [0.8, 0.6, 0.4]'
    ngram = _speedup(tmp_path, capsys, SPEC)
    eagle = _speedup(tmp_path, capsys, '{"method": "eagle", ' + rates + "}")
    mtp = _speedup(tmp_path, capsys, '{"method": "mtp", ' + rates + "}")
    assert "drafter: llama-3-8b mtp head, 1 layers" in capsys.readouterr().out
    half = _speedup(tmp_path, capsys,
                    '{"method": "draft_model", "draft_num_layers": 16, ' + rates + "}")
    assert ngram > eagle == mtp > half


def test_a_drafter_on_a_calibration_needs_its_own(tmp_path, capsys):
    from sim.cost.calibrated import CalibratedCostModel, feature_names

    path = tmp_path / "cal.json"
    CalibratedCostModel(tuple(1e-4 for _ in feature_names()), meta={}).save(path)
    code = main(["simulate", "--trace", TRACE, "--cost-model", str(path),
                 "--speculative-config",
                 '{"method": "draft_model", "model": "tiny", "acceptance_rates": [0.5, 0.4, '
                 '0.3, 0.2]}'])
    assert code != 0
    assert "draft_cost_model" in capsys.readouterr().err
    spec = ('{"method": "draft_model", "model": "tiny", "acceptance_rates": [0.5, 0.4, 0.3, '
            f'0.2], "draft_cost_model": "{path}"}}')
    assert main(["simulate", "--trace", TRACE, "--cost-model", str(path),
                 "--speculative-config", spec]) == 0, capsys.readouterr().err
