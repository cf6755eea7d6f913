"""Clusters from the command line: --replicas/--router, --pd, --tp, and `servelab plan`."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from servelab.cli import main
from sim.specs.hardware import gpu_hour_usd

CONV = ["--trace", "azure-conv", "--max-requests", "2000", "--qps-scale", "16"]


def run_json(tmp_path: Path, capsys, *argv: str, name: str = "r.json") -> tuple[dict, str]:
    path = tmp_path / name
    code = main([*argv, "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(path.read_text()), out


def test_four_replicas_cut_p99_ttft_and_write_per_replica_tables(tmp_path, capsys):
    one, _ = run_json(tmp_path, capsys, "simulate", *CONV, "--replicas", "1", name="one.json")
    four, out = run_json(tmp_path, capsys, "simulate", *CONV, "--replicas", "4", "--router",
                         "least-requests", "--out", str(tmp_path / "out"), name="four.json")
    one, four = one["results"]["continuous"], four["results"]["continuous"]
    assert four["completed"] + four["rejected"] == 2000 and four["completed"] == one["completed"]
    assert four["p99_ttft_ms"] < one["p99_ttft_ms"]
    replicas = pd.read_csv(tmp_path / "out" / "replicas_continuous.csv")
    assert replicas["replica"].tolist() == [0, 1, 2, 3]
    assert replicas["requests"].sum() == 2000 and (replicas["requests"] > 0).all()
    requests = pd.read_csv(tmp_path / "out" / "requests_continuous.csv")
    assert sorted(requests["replica"].unique()) == [0, 1, 2, 3]
    assert "4 replicas, router least-requests" in out


def test_pd_split_and_slow_link_raise_ttft(tmp_path, capsys):
    args = ["simulate", *CONV[:4], "--qps-scale", "2", "--pd", "1:3", "--policy", "chunked"]
    fast, _ = run_json(tmp_path, capsys, *args, name="fast.json")
    slow, _ = run_json(tmp_path, capsys, *args, "--kv-link-gbps", "5", name="slow.json")
    assert fast["config"]["cluster"]["num_prefill"] == 1
    assert [r["role"] for r in fast["replicas"]["chunked"]] == ["prefill"] + ["decode"] * 3
    fast, slow = fast["results"]["chunked"], slow["results"]["chunked"]
    assert fast["completed"] == slow["completed"] > 1900
    # Llama-3-8B: 128 KiB of KV a token; a ~1000-token prompt crosses 5 Gb/s in ~0.2 s.
    assert slow["median_ttft_ms"] > fast["median_ttft_ms"] + 150


def test_tensor_parallel_70b_runs_where_one_gpu_cannot_hold_it(tmp_path, capsys):
    args = ["simulate", *CONV[:4], "--model", "llama-3-70b", "--max-requests", "200"]
    assert main(args) == 2
    assert "does not fit on h100" in capsys.readouterr().err
    result, out = run_json(tmp_path, capsys, *args, "--tp", "4")
    # Named, the deployment runs vLLM's way: chunked prefill.
    assert result["results"]["chunked"]["completed"] == 200 and "4x h100" in out


@pytest.mark.parametrize("argv, message", [
    (["--pd", "2"], "--pd takes P:D"),
    (["--pd", "0:2"], "at least one engine of each kind"),
    (["--pd", "1:1", "--replicas", "2"], "either --replicas or --pd"),
    (["--replicas", "0"], "--replicas: expected an integer >= 1"),
])
def test_bad_cluster_flags_fail_with_one_line(argv, message, capsys):
    assert main(["simulate", *CONV[:4], *argv]) == 2
    assert message in capsys.readouterr().err


def test_plan_configurations_hold_the_slo_when_simulated_on_their_own(tmp_path, capsys):
    trace = ["--trace", "azure-conv", "--max-requests", "600", "--qps-scale", "12"]
    plan, out = run_json(tmp_path, capsys, "plan", *trace, "--hardware", "h100,a100-80gb",
                         "--tp", "1,2", "--pd-ratios", "1:2", "--workers", "1",
                         "--rate-range", "1,4", "--out", str(tmp_path / "plan"))
    best = plan["cheapest_per_hardware"]
    assert {row["hardware"] for row in best} == {"h100", "a100-80gb"}
    assert (tmp_path / "plan" / "plan.png").exists()
    for row in best + plan["cheapest"]:
        assert row["usd_per_hour"] == pytest.approx(row["gpus"] * gpu_hour_usd(row["hardware"]))
        alone, _ = run_json(tmp_path, capsys, "simulate", *trace, *row["simulate_args"])
        summary = alone["results"][row["policy"]]
        assert summary["p99_ttft_ms"] <= plan["slo"]["ttft_p99_ms"]
        assert summary["p99_itl_ms"] <= plan["slo"]["itl_p99_ms"]
        assert summary["p99_ttft_ms"] == pytest.approx(row["p99_ttft_ms"])
    # Each cheapest deployment holds the SLO at the trace's rate, so at least up to it.
    assert all(row["max_rate_rps"] >= row["rate_rps"] for row in best)
    assert "cheapest per GPU type" in out
