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


def test_simulate_of_an_unpriced_drafter_is_named(capsys):
    code = main(["simulate", "--trace", TRACE, "--speculative-config",
                 '{"method": "eagle", "num_speculative_tokens": 1, "acceptance_rates": [0.5]}'])
    assert code != 0
    assert "not priced yet" in capsys.readouterr().err
