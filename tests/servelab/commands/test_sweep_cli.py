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
    # static misses the SLO at 2x, so 8x is not run: its row says so, with no numbers.
    skipped = table["not_run"].notna()
    assert list(table[skipped][["policy", "qps_scale"]].itertuples(index=False)) == \
        [("static", 8.0)]
    assert table["not_run"][skipped].tolist() == ["not run (fails at lower rate 2x)"]
    assert (table["completed"][~skipped] == 400).all() and table["completed"][skipped].isna().all()
    assert "not run (fails at lower rate 2x)" in out and "NaN" not in out
    assert pd.read_csv(out_dir / "sweep.csv").shape == table.shape
    capacity = pd.read_csv(out_dir / "capacity.csv")
    assert len(capacity) == 3 and (out_dir / "latency_vs_load.png").stat().st_size > 10_000
    payload = json.loads((tmp_path / "s.json").read_text())
    assert len(payload["rows"]) == 6 and len(payload["capacity"]) == 3
    assert "capacity at p99 TTFT <= 2000 ms" in out
    # More load never helps: a higher rate has at least the p99 TTFT of a lower one.
    for _, rows in table[table["policy"] == "chunked"].groupby("token_budget"):
        ttft = rows.sort_values("qps_scale")["p99_ttft_ms"].to_numpy()
        assert ttft[1] >= ttft[0]


def test_capacity_is_the_same_with_every_rate_and_probe_run_to_its_end(tmp_path, capsys):
    grid_args = [*ARGS, "--policies", "static,continuous,chunked", "--qps-scales",
                 "1,2,4,8,16", "--capacity", "--capacity-range", "0.5,32"]
    answers, outs = [], []
    for extra in ((), ("--capacity-full-runs",)):
        path = tmp_path / f"s{len(extra)}.json"
        assert main([*grid_args, *extra, "--json", str(path)]) == 0
        answers.append(json.loads(path.read_text()))
        outs.append(capsys.readouterr().out)
    fast, full = answers
    assert fast["capacity"] == full["capacity"]
    ran = [row for row in fast["rows"] if "not_run" not in row]
    assert len(ran) < len(full["rows"])  # rates above a failing one were not run
    full_rows = {(r["policy"], r["qps_scale"]): r for r in full["rows"]}
    for row in ran:  # and those that ran are the full sweep's rows
        assert row == full_rows[row["policy"], row["qps_scale"]]
    assert "decided by one at another rate (not run)" in outs[0]
    assert "not run" not in outs[1]


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
