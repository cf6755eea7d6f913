"""`servelab run --out DIR`: the measured run's tables, charts and summary, as simulate's."""

from __future__ import annotations

import json

import pandas as pd

from servelab.cli import main
from tests.servelab.commands.test_model_cli import MODEL, TRACE

CHARTS = ("ttft_cdf.png", "itl_cdf.png", "throughput_latency.png", "timeline.png")


def test_run_out_writes_request_and_step_tables_charts_and_summary(tmp_path, capsys):
    out, saved = tmp_path / "out", tmp_path / "run.json"
    code = main(["run", "--trace", TRACE, "--policy", "continuous", "--max-num-seqs", "8",
                 *MODEL, "--out", str(out), "--json", str(saved)])
    assert code == 0, capsys.readouterr().err
    assert f"wrote 4 charts and 2 tables to {out}" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(saved.read_text())  # the payload --json writes
    assert set(summary) == {"trace", "config", "results"}
    result = summary["results"]["continuous"]
    requests = pd.read_csv(out / "requests_continuous.csv")
    assert len(requests) == 24 and requests["request_id"].is_unique
    assert (requests["finish_reason"] == "length").all()
    assert int(requests["output_len"].sum()) == result["total_output"]
    steps = pd.read_parquet(out / "steps_continuous.parquet")
    assert len(steps) == result["num_steps"] > 0
    assert (steps["duration_s"] > 0).all()  # measured, not simulated
    for name in CHARTS:
        assert (out / name).stat().st_size > 0
