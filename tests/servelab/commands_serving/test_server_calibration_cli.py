"""`calibrate --url` against `servelab serve`, then `simulate` with the server's limits."""

from __future__ import annotations

import json

import pytest

from executor.backend import load_model
from executor.native import ROW_KNOTS
from servelab.cli import main
from tests.servelab.serve.helpers import BLOCK_SIZE, MAX_MODEL_LEN, MODEL, start_server

TRACE = "synthetic:n=40,rate=40,prompt=uniform(20,150),output=uniform(4,40)"


@pytest.fixture(scope="module")
def tiny_model():
    return load_model(MODEL)


def test_calibrate_from_a_servers_url_and_simulate_as_that_server(tiny_model, tmp_path, capsys):
    path = tmp_path / "server.json"
    with start_server(tiny_model, policy="chunked", num_blocks=900, max_num_seqs=32) as server:
        code = main(["calibrate", "--url", server.url, "--out", str(path), "--quick",
                     "--max-num-seqs", "32", "--token-budget", "2048"])
        printed = capsys.readouterr()
        assert code == 0, printed.err
        validated = tmp_path / "validate.json"
        code = main(["validate", "--url", server.url, "--cost-model", str(path), "--trace",
                     TRACE, "--repeats", "2", "--json", str(validated)])
        assert code == 0, capsys.readouterr().err
    assert "request overhead" in printed.out
    saved = json.loads(path.read_text())
    assert saved["request_overhead_s"] > 0
    # The server publishes its kernels' row knots (servelab:kernel_info); the fit uses them.
    assert tuple(saved["row_knots"]) == (ROW_KNOTS if tiny_model.native else ())
    server_meta = saved["meta"]["server"]
    assert server_meta == {"url": server.url, "model": MODEL, "policy": "chunked",
                           "max_num_seqs": 32, "token_budget": 2048, "num_blocks": 900,
                           "block_size": BLOCK_SIZE, "max_model_len": MAX_MODEL_LEN,
                           "enable_prefix_caching": True}
    # The tiny model's steps last about a millisecond, the client's timing jitter as much:
    # the fit's accuracy is checked against a server of known costs (test_remote.py). Which
    # observations the fit keeps follows that jitter, so each kind probed is either held out
    # (kept) or counted among those left out of the fit.
    meta = saved["meta"]
    kept_kinds, outliers = set(meta["holdout_error_by_kind"]), meta["outliers_by_kind"]
    assert kept_kinds | set(outliers) >= {"lone TTFT", "decode", "join TTFT"}
    assert kept_kinds and sum(outliers.values()) < meta["observations"]
    check = json.loads(validated.read_text())
    assert check["config"]["policy"] == "chunked" and check["config"]["num_blocks"] == 900
    measured = check["results"]["chunked"]["measured"]
    assert measured["completed"] == 40 and check["repeats"] == 2
    assert check["overall"]["median_abs_error"] is not None
    out = tmp_path / "sim.json"
    assert main(["simulate", "--trace", TRACE, "--cost-model", str(path),
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (policy, config), = result["config"]["scheduler"].items()
    assert policy == "chunked" and config["num_blocks"] == 900
    assert config["max_num_seqs"] == 32 and config["token_budget"] == 2048
    assert result["results"]["chunked"]["completed"] == 40


def test_a_server_that_does_not_answer_is_one_line(capsys, tmp_path):
    code = main(["calibrate", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "x.json")])
    assert code != 0
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
