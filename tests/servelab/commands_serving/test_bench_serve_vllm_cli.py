"""`bench-serve` spoken as `vllm bench serve`: its flags against a scripted server, its
printed block and its saved result, with every key of our own kept."""

from __future__ import annotations

import json

from servelab.cli import main
from tests.servelab.bench.client_fakes import Script, ScriptedServer

VLLM_KEYS = {"date", "endpoint_type", "label", "model_id", "tokenizer_id", "num_prompts",
             "request_rate", "burstiness", "max_concurrency", "duration", "completed",
             "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
             "request_goodput", "output_throughput", "total_token_throughput",
             "max_output_tokens_per_s", "max_concurrent_requests"}


def test_vllm_flags_send_save_and_print_vllms_result(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_len,output_len\n" + "0.0,8,3\n" * 6)
    ours = tmp_path / "ours.json"
    with ScriptedServer(Script()) as server:
        code = main(["bench-serve", "--base-url", server.url, "--trace", str(trace),
                     "--num-prompts", "4", "--request-rate", "inf", "--max-concurrency", "2",
                     "--goodput", "ttft:60000", "e2el:60000",
                     "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99.9",
                     "--save-result", "--result-dir", str(tmp_path / "results"),
                     "--json", str(ours)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert sum(server.seen.values()) == 4  # --num-prompts: the trace's first four
    assert "Serving Benchmark Result" in printed and "P99.9 E2EL (ms):" in printed
    assert "Maximum request concurrency:             2" in printed
    [saved] = (tmp_path / "results").iterdir()
    assert saved.name.startswith("servelab-infqps-concurrency2-scripted-")
    result = json.loads(saved.read_text())
    assert set(result) >= VLLM_KEYS
    assert {"p50_ttft_ms", "p99.9_ttft_ms", "std_e2el_ms"} <= set(result)
    assert "mean_itl_ms" not in result  # not among --percentile-metrics
    assert result["completed"] == 4 and result["request_rate"] == "inf"
    assert result["request_goodput"] == result["request_throughput"]  # generous SLOs
    # Ours, whole, under "servelab": the same payload --json wrote.
    assert result["servelab"] == json.loads(ours.read_text())
    summary = result["servelab"]["results"]["server"]
    assert summary["goodput"] == summary["request_throughput"]
    assert {"mean_itl_ms", "p99_tpot_ms", "retried", "failed"} <= set(summary)


def test_goodput_and_slo_flags_do_not_combine(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_len,output_len\n0.0,8,3\n")
    code = main(["bench-serve", "--trace", str(trace), "--goodput", "ttft:100",
                 "--slo-ttft-ms", "100"])
    assert code == 2 and "give one" in capsys.readouterr().err
