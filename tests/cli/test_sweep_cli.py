"""`servelab sweep`, in-process: the table, capacity, outputs, bad values."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from servelab.cli import main

ARGS = ["sweep", "--trace", "azure-conv", "--max-requests", "400", "--workers", "1"]


def test_sweep_writes_one_row_per_point_and_capacity(tmp_path, capsys):
    out_dir = tmp_path / "sweep"
    code = main([*ARGS, "--policies", "static,chunked", "--qps-scales", "2,8",
                 "--token-budgets", "512,2048", "--capacity", "--capacity-range", "0.5,16",
                 "--out", str(out_dir), "--json", str(tmp_path / "s.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    table = pd.read_parquet(out_dir / "sweep.parquet")
    assert len(table) == 2 * (1 + 2)  # static at two rates, chunked x two budgets
    assert set(table["token_budget"][table["policy"] == "chunked"]) == {512, 2048}
    assert (table["completed"] == 400).all()
    assert pd.read_csv(out_dir / "sweep.csv").shape == table.shape
    capacity = pd.read_csv(out_dir / "capacity.csv")
    assert len(capacity) == 3 and (out_dir / "latency_vs_load.png").stat().st_size > 10_000
    payload = json.loads((tmp_path / "s.json").read_text())
    assert len(payload["rows"]) == 6 and len(payload["capacity"]) == 3
    assert "capacity at p99 TTFT <= 2000 ms" in out
    # More load never helps: a higher rate has at least the p99 TTFT of a lower one.
    for _, rows in table.groupby(["policy", "token_budget"]):
        ttft = rows.sort_values("qps_scale")["p99_ttft_ms"].to_numpy()
        assert ttft[1] >= ttft[0]


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--qps-scales", "1,x", "comma-separated floats"),
    ("--qps-scales", "1,-2", "must be > 0"),
    ("--num-blocks", "", "is empty"),
    ("--policies", "static,fast", "unknown policy"),
    ("--capacity-range", "4,2", "0 < low < high"),
    ("--capacity-range", "1,2,3", "LOW,HIGH"),
    ("--token-budgets", "64", "token_budget 64 < max_num_seqs 256"),
])
def test_bad_values_end_with_one_line(flag, value, message, capsys):
    argv = [*ARGS, flag, value]
    if flag == "--capacity-range":
        argv.append("--capacity")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
