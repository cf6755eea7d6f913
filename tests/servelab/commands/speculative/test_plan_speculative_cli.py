"""`plan --speculative-config`: every probed engine speculates, priced as simulate prices it,
and each listed deployment's replay flags carry the config."""

from __future__ import annotations

import json

from servelab.cli import main

PLAN = ["plan", "--trace", "azure-conv", "--max-requests", "120", "--hardware", "h100",
        "--tp", "1", "--workers", "1", "--rate-range", "1,2", "--pd-ratios", "",
        "--model", "meta-llama/Llama-3.1-8B-Instruct"]
EAGLE = {"method": "eagle3", "num_speculative_tokens": 3,
         "acceptance_rates": [0.665, 0.442, 0.294]}


def _plan(tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    assert main([*PLAN, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_plan_speculates_on_every_engine_and_replays_with_the_config(tmp_path, capsys):
    plain = _plan(tmp_path, "plain")
    spec = _plan(tmp_path, "spec", "--speculative-config", json.dumps(EAGLE))
    printed = capsys.readouterr().out
    assert "speculative decoding on every engine" in printed and '"eagle3"' in printed
    assert plain["speculative_config"] is None
    assert spec["speculative_config"]["num_speculative_tokens"] == 3
    row, base = spec["cheapest_per_hardware"][0], plain["cheapest_per_hardware"][0]
    assert row["p99_itl_ms"] != base["p99_itl_ms"]  # the drafter and verify steps priced
    flags = row["simulate_args"]
    assert json.loads(flags[flags.index("--speculative-config") + 1])["method"] == "eagle3"
    assert "--speculative-config" not in base["simulate_args"]


def test_plan_refuses_a_bad_speculative_config_in_one_line(capsys):
    assert main([*PLAN, "--speculative-config", '{"method": "ngram", "bogus": 1}']) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
