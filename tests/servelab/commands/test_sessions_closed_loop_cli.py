"""`sweep`, `plan`, `run` and `validate` take a session spec closed-loop by default, as
`simulate` does, and replay its written arrival times with --open-loop."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from servelab.cli import main
from tests.servelab.commands.test_model_cli import MODEL

CHAT = ("synthetic:users=8,rate=4,turns=fixed(3),think=fixed(0.5),question=fixed(200),"
        "output=fixed(60)")
DEPLOYMENT = ["--hardware", "a100-80gb", "--policy", "continuous"]


def _json(tmp_path, argv: list[str]) -> dict:
    path = tmp_path / "out.json"
    assert main([*argv, "--json", str(path)]) == 0
    return json.loads(path.read_text())


@pytest.mark.parametrize("open_loop", [[], ["--open-loop"]])
def test_sweep_row_is_simulates_summary_closed_loop_or_open(tmp_path, capsys, open_loop):
    simulated = _json(tmp_path, ["simulate", "--trace", CHAT, *DEPLOYMENT, *open_loop])
    row, = _json(tmp_path, ["sweep", "--trace", CHAT, "--hardware", "a100-80gb",
                            "--policies", "continuous", "--qps-scales", "1", "--workers", "1",
                            *open_loop])["rows"]
    for key in ("duration_s", "median_ttft_ms", "p99_e2el_ms", "prefix_cache_hit_rate"):
        assert row[key] == simulated["results"]["continuous"][key]
    capsys.readouterr()


def test_plan_runs_sessions_closed_loop_and_says_how_to_simulate_it(tmp_path, capsys):
    argv = ["plan", "--trace", CHAT, "--hardware", "a100-80gb", "--tp", "1", "--pd-ratios", "",
            "--workers", "1", "--rate-range", "1,2"]
    closed = _json(tmp_path, argv)["cheapest"][0]
    opened = _json(tmp_path, [*argv, "--open-loop"])["cheapest"][0]
    assert "--open-loop" in opened["simulate_args"]
    assert "--open-loop" not in closed["simulate_args"]
    # Each turn waits for the previous answer: the closed loop's run ends later.
    assert closed["duration_s"] > opened["duration_s"]
    capsys.readouterr()


def test_validate_url_refuses_open_loop(tmp_path, capsys):
    calibration = tmp_path / "cal.json"
    calibration.write_text("{}")
    code = main(["validate", "--url", "http://127.0.0.1:9", "--cost-model", str(calibration),
                 "--trace", CHAT, "--open-loop"])
    err = capsys.readouterr().err
    assert code == 2 and "--open-loop: not with --url" in err


def test_run_sends_each_turn_after_the_previous_measured_answer(tmp_path, capsys):
    spec = ("synthetic:users=2,rate=4,turns=fixed(3),think=fixed(0.25),question=fixed(12),"
            "output=fixed(4)")
    out = tmp_path / "run"
    assert main(["run", "--trace", spec, "--policy", "continuous", *MODEL,
                 "--out", str(out)]) == 0, capsys.readouterr().err
    rows = pd.read_csv(out / "requests_continuous.csv").set_index("request_id")
    for session in ("s0", "s1"):
        for k in (1, 2):
            before, after = rows.loc[f"{session}-t{k - 1}"], rows.loc[f"{session}-t{k}"]
            assert after["arrival_s"] == pytest.approx(before["finish_s"] + 0.25, abs=1e-9)
