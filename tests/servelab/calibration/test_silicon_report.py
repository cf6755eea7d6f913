"""fidelity-gpu's silicon part: the table, the refusals, the chart and the JSON."""

from __future__ import annotations

import json

import pytest

from servelab.cli import main
from servelab.reporting.charts.silicon_charts import silicon_scatter
from sim.measured.silicon import RowResult, simulate_row
from sim.measured.silicon_rows import SiliconRow, replay_plan


def test_fidelity_gpu_silicon_only_prints_the_table_and_writes_chart_and_json(tmp_path, capsys):
    assert main(["fidelity-gpu", "--silicon-only", "--silicon-rounds", "1",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Splitwise" not in out
    assert "AIConfigurator's H100 vLLM runs" in out
    assert "openai/gpt-oss-120b" in out and "MiniMaxAI/MiniMax-M2.5" in out  # their groups
    data = json.loads((tmp_path / "silicon_h100.json").read_text())
    overall = data["table"][-1]
    assert (overall["model"], overall["rows"]) == ("all", 237)
    assert overall["simulated"] == sum(1 for r in data["rows"] if not r["refused"])
    assert sum(data["refused"].values()) == 237 - overall["simulated"]
    assert (tmp_path / "silicon_h100.png").stat().st_size > 0


def test_fidelity_gpu_refuses_zero_silicon_rounds(tmp_path, capsys):
    assert main(["fidelity-gpu", "--silicon-only", "--silicon-rounds", "0",
                 "--out", str(tmp_path)]) == 2
    assert "--silicon-rounds: expected an integer >= 1" in capsys.readouterr().err


def test_scatter_needs_a_predicted_row(tmp_path):
    row = SiliconRow("x", "Qwen/Qwen3-32B", "", "", "", "", 8, 8, 1, 1, 1, 1, 0, 0, 1.0, 1.0)
    with pytest.raises(ValueError, match="no row has a prediction"):
        silicon_scatter([RowResult(row, None, None, "why")], tmp_path / "x.png", "t")


def test_a_row_replays_as_simulate_runs_its_flags(tmp_path, capsys):
    """The harness and `servelab simulate --users` with the row's vLLM flags are one path."""
    row = SiliconRow("small", "Qwen/Qwen3-32B", "", "", "", "", 64, 4, 3, 2, 1, 1, 1, 1,
                     100.0, 10.0)
    plan = replay_plan(row, rounds=2)
    out = tmp_path / "run.json"
    assert main(["simulate", "--trace",
                 f"synthetic:n={plan.measured_requests},rate=1000,prompt=fixed({row.isl}),"
                 f"output=fixed({row.osl})", "--users", str(plan.users), "--model", row.model,
                 "--hardware", "h100", "--tp", str(plan.tensor_parallel), "--policy", "chunked",
                 "--max-num-seqs", str(plan.max_num_seqs),
                 "--max-num-batched-tokens", str(plan.max_num_batched_tokens),
                 "--max-model-len", str(plan.max_model_len), "--json", str(out)]) == 0
    capsys.readouterr()
    cli = json.loads(out.read_text())["results"]["chunked"]
    ours = simulate_row(row, rounds=2)
    assert ours.ttft_ms == pytest.approx(cli["mean_ttft_ms"])
    assert ours.tpot_ms == pytest.approx(cli["mean_tpot_ms"])
