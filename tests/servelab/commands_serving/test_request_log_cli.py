"""The server's SQLite request log end to end: every arrival survives a SIGKILL, `servelab
trace` reads a log, `servelab bench-serve` replays are logged with the trace lengths."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from executor.backend import load_model
from servelab.cli import main
from servelab.serve.request_log import RequestLog
from tests.servelab.serve.helpers import MODEL, async_client, start_server
from tests.servelab.serve.test_request_log import row
from tests.servelab.serve.test_serve_lifecycle import SIMULATED, ServeProcess, stream
from workloads import load_trace


@pytest.fixture(scope="module")
def tiny_model():
    return load_model(MODEL)


async def _committed(log: Path, rows: int, timeout_s: float) -> bool:
    """Whether the log holds `rows` committed rows (as another process sees it) in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with sqlite3.connect(log) as db:
            if db.execute("SELECT COUNT(*) FROM requests").fetchone()[0] >= rows:
                return True
        await asyncio.sleep(0.05)
    return False


def test_sigkill_mid_flight_keeps_every_arrival_and_each_finish(tmp_path):
    log = tmp_path / "requests.sqlite"
    # Each request names itself as its tenant: the rows of unfinished ones have no known id.
    short = [{"prompt": [5] * 6, "max_tokens": 4, "ignore_eos": True, "user": f"s{i}"}
             for i in range(5)]
    long = [{"prompt": [9] * (6 + i), "max_tokens": 8000, "ignore_eos": True, "user": f"l{i}"}
            for i in range(15)]
    # Simulated steps take a set ~7 ms however fast the CPU: the long ones stream for
    # about a minute, far past the kill.
    server = ServeProcess(log, backend=SIMULATED)

    async def main():
        async with async_client(server.url) as client:
            started = [asyncio.Event() for _ in long]
            cut = [asyncio.create_task(stream(client, body, event))
                   for body, event in zip(long, started, strict=True)]
            done = await asyncio.gather(*(stream(client, body) for body in short))
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
            committed = await _committed(log, len(short) + len(long), 30.0)  # a hang guard
            server.proc.send_signal(signal.SIGKILL)  # the long ones are still streaming
            return done, await asyncio.gather(*cut), committed

    try:
        done, cut, committed = asyncio.run(main())
        assert server.proc.wait(10) == -signal.SIGKILL
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)
    assert committed, "arrivals not committed within 30 s"
    assert all(finish == "length" for _, finish in done)
    assert all(finish is None for _, finish in cut)
    with sqlite3.connect(log) as db:
        rows = {r[0]: r[1:] for r in db.execute(
            "SELECT tenant, prompt_len, output_len, finish_s IS NOT NULL, finish_reason "
            "FROM requests")}
    assert set(rows) == {body["user"] for body in short + long}
    for body in short:
        assert rows[body["user"]] == (6, 4, 1, "length")
    for body in long:
        assert rows[body["user"]] == (len(body["prompt"]), 0, 0, "unfinished")
    trace = load_trace(log)  # the replay sees all the traffic, cut-off requests at max_tokens
    lengths = dict(zip(trace.table["tenant"], trace.output_len.tolist(), strict=True))
    assert lengths == {body["user"]: body["max_tokens"] for body in short + long}


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
