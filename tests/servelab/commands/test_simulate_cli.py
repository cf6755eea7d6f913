"""`servelab simulate` / `compare`, run in-process: results, determinism, outputs, bad values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.cli import main

SUMMARY_KEYS = [
    "completed", "failed", "total_input", "total_output", "request_throughput",
    "output_throughput", "total_token_throughput", "rejected", "preemptions",
    "mean_batch_size", "max_batch_size", "mean_kv_usage", "slot_utilization",
] + [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
     for s in ("mean", "median", "p90", "p95", "p99")]

SMALL = "synthetic:n=300,rate=40,arrival=gamma,cv=3,prompt=lognormal(800,1),output=pareto(20,1.5)"


def run_json(tmp_path: Path, capsys: pytest.CaptureFixture, *argv: str, name: str = "r.json"):
    path = tmp_path / name
    code = main([*argv, "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(path.read_text()), path, out


def test_compare_on_saturated_conv_trace_ranks_policies(tmp_path, capsys):
    """At 8x the conv trace's rate the default deployment is saturated."""
    result, _, out = run_json(tmp_path, capsys, "compare", "--trace", "azure-conv",
                              "--max-requests", "3000", "--qps-scale", "8")
    r = result["results"]
    assert set(r) == {"static", "continuous", "recompute", "chunked"}
    for summary in r.values():
        assert set(SUMMARY_KEYS) <= set(summary)
        assert summary["completed"] + summary["rejected"] == 3000
    static, cont = r["static"], r["continuous"]
    assert cont["output_throughput"] > 1.5 * static["output_throughput"]
    assert cont["median_ttft_ms"] < static["median_ttft_ms"]
    assert cont["p95_ttft_ms"] < static["p95_ttft_ms"]
    # Long prompts stall every decode under whole-prompt prefill; chunks bound the stall.
    assert r["chunked"]["p99_itl_ms"] < 0.5 * r["recompute"]["p99_itl_ms"]
    assert static["slot_utilization"] < cont["slot_utilization"] == 1.0
    assert "output_throughput" in out and "chunked" in out


def test_same_seed_gives_the_same_json_byte_for_byte(tmp_path, capsys):
    argv = ["compare", "--trace", SMALL, "--policies", "continuous,chunked", "--workers", "2",
            "--num-blocks", "300", "--seed"]
    _, first, _ = run_json(tmp_path, capsys, *argv, "7", name="a.json")
    _, second, _ = run_json(tmp_path, capsys, *argv, "7", name="b.json")
    _, other, _ = run_json(tmp_path, capsys, *argv, "8", name="c.json")
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() != other.read_bytes()


def test_undersized_pool_completes_every_request_with_preemptions(tmp_path, capsys):
    result, _, _ = run_json(tmp_path, capsys, "compare", "--trace", SMALL, "--num-blocks",
                            "400", "--max-model-len", "4096", "--policies",
                            "continuous,recompute,chunked")
    for policy, summary in result["results"].items():
        assert summary["completed"] + summary["rejected"] == 300, policy
        assert summary["failed"] == 0
    assert result["results"]["recompute"]["preemptions"] > 0
    assert result["results"]["chunked"]["preemptions"] > 0


def test_simulate_out_writes_tables_charts_and_summary(tmp_path, capsys):
    out_dir = tmp_path / "out"
    code = main(["simulate", "--trace", SMALL, "--policy", "chunked", "--slo-ttft-ms", "500",
                 "--slo-tpot-ms", "50", "--out", str(out_dir)])
    assert code == 0, capsys.readouterr().err
    names = {p.name for p in out_dir.iterdir()}
    assert {"requests_chunked.csv", "steps_chunked.parquet", "summary.json", "ttft_cdf.png",
            "itl_cdf.png", "throughput_latency.png", "timeline.png"} <= names
    summary = json.loads((out_dir / "summary.json").read_text())["results"]["chunked"]
    assert 0 <= summary["goodput"] <= summary["request_throughput"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["simulate", "--trace", "azure-code", "--policy", "fifo"], "unknown policy"),
        (["compare", "--trace", "azure-code", "--policies", "static,lifo"], "unknown policy"),
        (["simulate", "--trace", "azure-code", "--num-blocks", "0"], "--num-blocks"),
        (["simulate", "--trace", "azure-code", "--policy", "chunked", "--token-budget", "-5"],
         "--token-budget"),
        (["simulate", "--trace", "no-such-trace"], "no-such-trace"),
        (["simulate", "--trace", "azure-code", "--hardware", "tpu"], "tpu"),
        (["compare", "--trace", "azure-code", "--workers", "0"], "--workers"),
        (["simulate", "--trace", "azure-code", "--users", "0"], "--users"),
        (["compare", "--trace", "azure-code", "--users", "2", "--open-loop"], "--open-loop"),
    ],
)
def test_bad_cli_values_give_one_line_and_nonzero_exit(argv, needle, capsys, tmp_path):
    json_path = tmp_path / "never.json"
    code = main([*argv, "--json", str(json_path)])
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "error" in lines[0]
    assert not json_path.exists()


def test_prefix_caching_flag_as_vllm_spells_it(tmp_path, capsys):
    """Mooncake's shared prefixes hit with caching on (the default), never with it off."""
    argv = ["simulate", "--trace", "mooncake-synthetic", "--max-requests", "600",
            "--policy", "chunked", "--max-model-len", "200000", "--qps-scale", "0.1",
            "--num-blocks", "600000"]
    on, _, out = run_json(tmp_path, capsys, *argv, name="on.json")
    off, _, _ = run_json(tmp_path, capsys, *argv, "--no-enable-prefix-caching", name="off.json")
    rate_on = on["results"]["chunked"]["prefix_cache_hit_rate"]
    # An unbounded cache serves 11.3% of these prompts' tokens (conversations come back later).
    assert 0.105 < rate_on <= 0.1133 and "prefix_cache_hit_rate" in out
    assert off["results"]["chunked"]["prefix_cache_hit_rate"] == 0
    assert on["config"]["scheduler"]["chunked"]["enable_prefix_caching"] is True
    assert off["config"]["scheduler"]["chunked"]["enable_prefix_caching"] is False
    assert (on["results"]["chunked"]["median_ttft_ms"]
            < off["results"]["chunked"]["median_ttft_ms"])


def test_concurrency_users_wait_for_their_answers_unless_open_loop(tmp_path, capsys):
    """concurrency(4,200) is 4 closed-loop users; --open-loop sends all 200 at 0 s, so its
    requests queue behind each other; --users 4 on the same requests is the same loop."""
    spec = "synthetic:stages=concurrency(4,200),prompt=fixed(300),output=fixed(40)"
    argv = ["simulate", "--trace", spec]
    closed, _, _ = run_json(tmp_path, capsys, *argv, name="closed.json")
    opened, _, _ = run_json(tmp_path, capsys, *argv, "--open-loop", name="open.json")
    plain = "synthetic:n=200,rate=1,prompt=fixed(300),output=fixed(40)"
    users, _, _ = run_json(tmp_path, capsys, "simulate", "--trace", plain, "--users", "4",
                           name="users.json")
    closed, opened, users = (r["results"]["continuous"] for r in (closed, opened, users))
    assert closed["completed"] == opened["completed"] == 200
    assert closed["max_batch_size"] == 4 and opened["max_batch_size"] > 4
    assert closed["p99_ttft_ms"] * 10 < opened["p99_ttft_ms"]
    assert users["max_batch_size"] == 4
    assert users["request_throughput"] == pytest.approx(closed["request_throughput"])


def test_compare_prints_and_writes_the_overload_verdict_beside_every_key(tmp_path, capsys):
    light = "synthetic:n=100,rate=1,prompt=fixed(200),output=fixed(50)"
    heavy = "synthetic:n=300,rate=40,prompt=uniform(100,400),output=uniform(50,200)"
    argv = ["--policies", "continuous,chunked", "--workers", "1"]
    calm, _, out = run_json(tmp_path, capsys, "compare", "--trace", light, *argv,
                            name="light.json")
    assert "continuous: stable: the queue grows" in out
    busy, _, out = run_json(tmp_path, capsys, "compare", "--trace", heavy, "--num-blocks",
                            "400", *argv, name="heavy.json")
    assert "continuous: falling behind" in out and "bound by KV blocks" in out
    for result in (calm, busy):
        for summary in result["results"].values():
            assert set(SUMMARY_KEYS) <= set(summary)
            assert set(summary["verdict"]) == {
                "state", "queue_growth_rps", "offered_rps", "binding", "binding_share",
                "waited_share", "sustainable_rps"}
    assert busy["results"]["continuous"]["verdict"]["state"] == "falling behind"
    assert calm["results"]["chunked"]["verdict"]["state"] == "stable"
