"""`plan` finds the same cheapest deployments whether it stops certain failures early and
prunes dear deployments or runs every probe of the full search to its end."""

from __future__ import annotations

import json

from servelab.cli import main

TRACE = ["--trace", "azure-conv", "--max-requests", "300", "--qps-scale", "12"]
SPACE = ["--hardware", "h100,a100-80gb", "--tp", "1,2", "--pd-ratios", "1:1", "--top", "3",
         "--workers", "1", "--rate-range", "1,4"]
KEYS = ("deployment", "scale", "engines", "gpus", "usd_per_hour", "p99_ttft_ms", "p99_itl_ms")


def _plan(tmp_path, capsys, *extra: str) -> tuple[dict, str]:
    path = tmp_path / f"plan{len(extra)}.json"
    assert main(["plan", *TRACE, *SPACE, "--json", str(path), *extra]) == 0
    return json.loads(path.read_text()), capsys.readouterr().out


def test_plan_answers_the_same_with_and_without_early_stops_and_pruning(tmp_path, capsys):
    fast, out = _plan(tmp_path, capsys)
    full, full_out = _plan(tmp_path, capsys, "--exhaustive")
    for key in ("cheapest_per_hardware", "cheapest"):
        assert [[row[k] for k in KEYS] for row in fast[key]] == \
            [[row[k] for k in KEYS] for row in full[key]]
    assert [row["max_qps_scale"] for row in fast["cheapest_per_hardware"]] == \
        [row["max_qps_scale"] for row in full["cheapest_per_hardware"]]
    assert full["runs"]["stopped"] == full["runs"]["skipped"] == 0
    assert fast["runs"]["stopped"] > 0
    assert fast["runs"]["started"] + fast["runs"]["skipped"] <= full["runs"]["started"]
    for text in (out, full_out):
        assert "NaN" not in text and "nan" not in text
        assert "stopped early" in text
    searched = {row["deployment"] for row in fast["cheapest_per_hardware"]}
    for row in fast["cheapest"]:
        if row["deployment"] not in searched:
            assert row["max_rate_rps"].startswith("not searched (")
