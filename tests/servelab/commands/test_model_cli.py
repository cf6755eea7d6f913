"""`servelab run`, `calibrate` and `validate` end to end on the tiny model (CPU, seconds)."""

from __future__ import annotations

import json

import pytest

from servelab.cli import main
from sim.cost.calibrated import feature_names

TRACE = "synthetic:n=24,rate=50,prompt=uniform(8,60),output=uniform(2,12)"
MODEL = ["--model", "tiny", "--threads", "1", "--kv-cache-gib", "0.01"]


def test_run_prints_and_saves_the_simulate_summary_keys(tmp_path, capsys):
    out = tmp_path / "run.json"
    code = main(["run", "--trace", TRACE, "--policy", "chunked", "--token-budget", "32",
                 "--max-num-seqs", "8", *MODEL, "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    summary = json.loads(out.read_text())["results"]["chunked"]
    assert summary["completed"] == 24 and summary["failed"] == 0
    for key in ("output_throughput", "median_ttft_ms", "p99_itl_ms", "mean_kv_usage"):
        assert summary[key] is not None
    assert "median_ttft_ms" in capsys.readouterr().out


def test_calibrate_then_validate_and_simulate_with_the_calibration(tmp_path, capsys):
    cal = tmp_path / "cal.json"
    assert main(["calibrate", *MODEL, "--quick", "--repeats", "1", "--out", str(cal)]) == 0
    saved = json.loads(cal.read_text())
    assert set(saved["features"]) == set(feature_names(tuple(saved["row_knots"])))
    assert saved["meta"]["model"] == "tiny" and "holdout_error" in saved["meta"]
    out = tmp_path / "val.json"
    code = main(["validate", "--trace", TRACE, "--policies", "continuous,static", *MODEL,
                 "--cost-model", str(cal), "--json", str(out), "--out", str(tmp_path / "v"),
                 "--repeats", "2"])
    assert code == 0, capsys.readouterr().err
    assert "measured runs of the same policy differed by" in capsys.readouterr().out
    saved_val = json.loads(out.read_text())
    result = saved_val["results"]
    assert set(result) == {"continuous", "static"}
    for policy in result.values():
        assert policy["measured"]["completed"] == policy["simulated"]["completed"] == 24
        assert "output_throughput" in policy["error"]
        assert policy["spread"]["median_e2el_ms"] >= 0
    assert saved_val["repeats"] == 2 and saved_val["overall"]["max_abs_error"] is not None
    assert (tmp_path / "v" / "fidelity_errors.png").exists()
    sim_json = tmp_path / "sim.json"
    assert main(["simulate", "--trace", TRACE, "--cost-model", str(cal),
                 "--json", str(sim_json)]) == 0
    assert json.loads(sim_json.read_text())["results"]["continuous"]["completed"] == 24


def test_validate_rejects_a_bad_calibration_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    code = main(["validate", "--trace", TRACE, *MODEL, "--cost-model", str(bad)])
    assert code == 2
    assert "not a servelab calibration" in capsys.readouterr().err


def test_validate_can_calibrate_during_its_measured_runs(tmp_path, capsys):
    cal, out = tmp_path / "cal.json", tmp_path / "val.json"
    code = main(["validate", "--trace", TRACE, "--policies", "continuous", *MODEL,
                 "--calibrate", str(cal), "--repeats", "2", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "calibrated during the measured runs" in printed and "held-out shapes" in printed
    assert "steps of the measured runs, measured / predicted" in printed
    assert "how slow the machine ran during each measured run" in printed
    assert "simulated at one speed throughout instead" in printed
    saved = json.loads(cal.read_text())
    assert saved["meta"]["repeats"] >= 2  # rounds interleaved with the runs, two at least
    assert len(saved["jitter"]) > 2 and saved["jitter"] == sorted(saved["jitter"])
    result = json.loads(out.read_text())
    assert result["config"]["calibrated_during_runs"] is True
    assert result["results"]["continuous"]["simulated"]["completed"] == 24
    speeds = result["results"]["continuous"]["speeds"]  # each run's, from the grid's timings
    assert len(speeds) == 2 and all(0.2 < v < 5 for v in speeds)
    windows = result["results"]["continuous"]["speed_windows"]  # the same, one window a run
    assert windows == [[[0.0, v]] for v in speeds]
    assert result["overall_at_run_speeds"]["max_abs_error"] is not None
    assert result["overall_at_one_speed"]["max_abs_error"] is not None
    steps = result["results"]["continuous"]["steps"]  # both runs' steps, by kind
    assert steps["with a prefill chunk"]["steps"] > 0 and steps["decode, 1-13 rows"]["steps"] > 0
    assert sum(kind["time_share"] for kind in steps.values()) == pytest.approx(1.0)


def test_validate_wants_exactly_one_calibration_source(tmp_path, capsys):
    assert main(["validate", "--trace", TRACE, *MODEL]) == 2
    assert main(["validate", "--trace", TRACE, *MODEL, "--cost-model", "a.json",
                 "--calibrate", "b.json"]) == 2
    assert "--calibrate" in capsys.readouterr().err
