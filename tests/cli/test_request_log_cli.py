"""`servelab trace` and `servelab bench-serve` with the server's SQLite request log."""

from __future__ import annotations

import json

import numpy as np
import pytest

from executor.backend import load_model
from serve.request_log import RequestLog
from servelab.cli import main
from tests.serve.helpers import MODEL, start_server
from tests.serve.test_request_log import row
from workloads import load_trace


@pytest.fixture(scope="module")
def tiny_model():
    return load_model(MODEL)


def test_trace_cli_summarizes_a_request_log(tmp_path, capsys):
    path = tmp_path / "seen.sqlite"
    log = RequestLog(path)
    for i in range(5):
        log.write(row(i))
    log.close()
    assert main(["trace", str(path)]) == 0
    assert "5" in capsys.readouterr().out


def test_bench_serve_replay_is_logged_with_the_trace_lengths(tiny_model, tmp_path, capsys):
    rng = np.random.default_rng(3)
    n = 24
    arrival = np.sort(rng.uniform(0, 0.5, n)).round(4)
    arrival -= arrival[0]
    prompts, outputs = rng.integers(2, 60, n), rng.integers(1, 16, n)
    tenants = [f"t{i % 3}" for i in range(n)]
    trace_file = tmp_path / "trace.csv"
    lines = ["arrival_s,prompt_len,output_len,tenant"]
    lines += [f"{a},{p},{o},{t}" for a, p, o, t in zip(arrival, prompts, outputs, tenants,
                                                         strict=True)]
    trace_file.write_text("\n".join(lines) + "\n")
    log_path, out = tmp_path / "served.sqlite", tmp_path / "bench.json"
    with start_server(tiny_model, request_log=log_path) as server:
        code = main(["bench-serve", "--url", server.url, "--trace", str(trace_file),
                     "--json", str(out), "--timeout-s", "60"])
        printed = capsys.readouterr()
        assert code == 0, printed.err
        logged = load_trace(log_path)  # while the server runs: every row already committed
    result = json.loads(out.read_text())
    assert set(result) == {"trace", "config", "results"}
    assert result["trace"] == {"name": "trace.csv", "requests": n, "span_s": float(arrival[-1])}
    summary = result["results"]["server"]
    assert summary["completed"] == n and summary["failed"] == 0
    assert summary["total_output"] == int(outputs.sum())
    for key in ("median_ttft_ms", "p99_itl_ms", "mean_tpot_ms", "p90_e2el_ms"):
        assert summary[key] is not None and summary[key] > 0
    assert "median_ttft_ms" in printed.out
    assert len(logged) == n
    seen = sorted(zip(logged.prompt_len.tolist(), logged.output_len.tolist(),
                      logged.table["tenant"], strict=True))
    sent = sorted(zip(prompts.tolist(), outputs.tolist(), tenants, strict=True))
    assert seen == sent


def test_bench_serve_rejects_a_bad_url(capsys):
    assert main(["bench-serve", "--url", "localhost:1", "--trace", "azure-conv"]) == 2
    assert "http://" in capsys.readouterr().err
