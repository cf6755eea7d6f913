"""`bench-serve` and `validate --url` against a server that drops a connection mid-request:
the request is counted as failed and the report is finished, unless too many failed."""

from __future__ import annotations

import json

import pytest

from servelab.cli import main
from sim.cost.calibrated import CalibratedCostModel, feature_names
from tests.servelab.bench.client_fakes import Script, ScriptedServer

DROPPED = 4  # the max_tokens (output_len) of the request the server cuts off


def write_trace(path, outputs: list[int]) -> None:
    """All requests at once, each named by its output length."""
    lines = ["arrival_s,prompt_len,output_len"] + [f"0.0,8,{n}" for n in outputs]
    path.write_text("\n".join(lines) + "\n")


def write_calibration(path) -> None:
    """A cost model of a server whose limits it records, as `calibrate --url` writes one."""
    server = {"policy": "chunked", "max_num_seqs": 32, "token_budget": 512, "num_blocks": 256,
              "block_size": 16, "max_model_len": 256, "enable_prefix_caching": True}
    names = feature_names(())
    CalibratedCostModel(tuple(1e-4 for _ in names), request_overhead_s=1e-3,
                        meta={"server": server, "num_blocks": 256}).save(path)


def test_bench_serve_counts_a_request_dropped_mid_stream_and_finishes(tmp_path, capsys):
    trace, out = tmp_path / "trace.csv", tmp_path / "bench.json"
    write_trace(trace, [3, DROPPED, 5])
    with ScriptedServer(Script(drop_after_headers={DROPPED})) as server:
        code = main(["bench-serve", "--url", server.url, "--trace", str(trace),
                     "--max-concurrency", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert server.seen == {3: 1, DROPPED: 1, 5: 1}  # the dropped one was not sent again
    summary = json.loads(out.read_text())["results"]["server"]
    assert summary["completed"] == 2 and summary["failed"] == 1 and summary["retried"] == 0
    assert "1 of 3 requests failed" in printed
    assert "error: 1: ClientPayloadError" in printed  # the trace row's id


def test_validate_counts_failed_requests_within_the_allowed_share(tmp_path, capsys):
    trace, model, out = tmp_path / "trace.csv", tmp_path / "server.json", tmp_path / "v.json"
    write_trace(trace, [DROPPED] + [5] * 19)
    write_calibration(model)
    with ScriptedServer(Script(drop_after_a_chunk={DROPPED})) as server:
        code = main(["validate", "--url", server.url, "--cost-model", str(model), "--trace",
                     str(trace), "--json", str(out)])
        printed = capsys.readouterr()
    assert code == 0, printed.err
    assert server.seen == {DROPPED: 1, 5: 19}
    assert "1 of 20 requests failed" in printed.out
    result = json.loads(out.read_text())
    assert result["failed_requests"]["count"] == 1 and result["failed_requests"]["sent"] == 20
    assert len(result["failed_requests"]["first_errors"]) == 1
    assert result["results"]["chunked"]["measured"]["completed"] == 19


def test_validate_stops_when_more_requests_fail_than_allowed(tmp_path, capsys):
    trace, model, out = tmp_path / "trace.csv", tmp_path / "server.json", tmp_path / "v.json"
    write_trace(trace, [DROPPED] + [5] * 19)
    write_calibration(model)
    with ScriptedServer(Script(drop_after_headers={DROPPED})) as server:
        code = main(["validate", "--url", server.url, "--cost-model", str(model), "--trace",
                     str(trace), "--max-failed-share", "0.01", "--json", str(out)])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1
    assert "1 of 20 requests failed" in err and "--max-failed-share" in err
    assert not out.exists()


@pytest.mark.parametrize("share", ["-0.1", "1.5", "nan"])
def test_validate_rejects_a_share_outside_zero_to_one(share, tmp_path, capsys):
    code = main(["validate", "--url", "http://127.0.0.1:9", "--cost-model",
                 str(tmp_path / "x.json"), "--trace", "azure-conv", "--max-failed-share", share])
    assert code != 0 and "--max-failed-share" in capsys.readouterr().err
