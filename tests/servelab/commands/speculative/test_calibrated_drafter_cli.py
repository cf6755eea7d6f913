"""`servelab calibrate` profiles the executor's drafter passes, and `simulate` prices a draft
model of the target's width on that calibration alone."""

from __future__ import annotations

import json

from servelab.cli import main
from tests.servelab.commands.test_model_cli import MODEL, TRACE


def test_calibrate_records_drafter_passes_that_price_a_draft_model(tmp_path, capsys):
    cal = tmp_path / "cal.json"
    assert main(["calibrate", *MODEL, "--quick", "--repeats", "1", "--out", str(cal)]) == 0
    record = json.loads(cal.read_text())["meta"]["drafter_passes"]
    assert record["target_layers"] == 2 and set(record["layers"]) == {"1", "2"}
    assert record["profiled_passes"] > 0
    capsys.readouterr()
    spec = ('{"method": "draft_model", "draft_num_layers": 1, "num_speculative_tokens": 2, '
            '"acceptance_rates": [0.8, 0.6]}')
    out = tmp_path / "sim.json"
    code = main(["simulate", "--trace", TRACE, "--cost-model", str(cal),
                 "--speculative-config", spec, "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "drafter: 1 of the target's 2 layers" in capsys.readouterr().out
    assert json.loads(out.read_text())["results"]["continuous"]["spec_tpot_speedup"] > 0
