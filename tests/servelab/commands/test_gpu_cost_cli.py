"""simulate and plan say which cost model priced the run and whether it lies in the data;
fidelity-gpu prints its validation tables."""

from __future__ import annotations

import json

import pytest

from servelab.cli import main

TRACE = ["--trace", "synthetic:n=20,rate=5,prompt=fixed(300),output=fixed(20)"]


def test_simulate_defaults_to_measured_kernels_and_records_them(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["simulate", *TRACE, "--hardware", "b200", "--json", str(out)]) == 0
    assert "priced by vllm-kernels: vLLM 0.24.0 kernel tables measured on b200" in (
        capsys.readouterr().out)
    assert json.loads(out.read_text())["deployment_spec"]["cost_model"] == "KernelCostModel"


def test_simulate_names_the_fitted_model_and_its_reach(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["simulate", *TRACE, "--hardware", "b200", "--cost", "gpu",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "priced by gpu-fitted" in printed and "extrapolated from its datasheet" in printed
    assert json.loads(out.read_text())["deployment_spec"]["cost_model"] == "GpuCostModel"


def test_simulate_keeps_the_roofline_by_name(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["simulate", *TRACE, "--cost", "roofline", "--json", str(out)]) == 0
    assert "priced by roofline" in capsys.readouterr().out
    assert json.loads(out.read_text())["deployment_spec"]["cost_model"] == "AnalyticCostModel"


def test_the_two_cost_models_price_differently(tmp_path, capsys):
    results = {}
    for cost in ("gpu", "roofline"):
        out = tmp_path / f"{cost}.json"
        assert main(["simulate", *TRACE, "--cost", cost, "--json", str(out)]) == 0
        results[cost] = json.loads(out.read_text())["results"]["continuous"]["mean_tpot_ms"]
    assert results["gpu"] != results["roofline"]


@pytest.mark.parametrize(("cost", "name", "line"), [
    ("auto", "vllm-kernels where the GPU has tables, else gpu-fitted",
     "GPU h100: vLLM 0.24.0 kernel tables measured on h100"),
    ("gpu", "gpu-fitted", "GPU h100 fitted"),
])
def test_plan_names_its_cost_model_and_coverage(tmp_path, capsys, cost, name, line):
    out = tmp_path / "plan.json"
    assert main(["plan", "--trace", "azure-conv", "--max-requests", "60", "--hardware", "h100",
                 "--tp", "1", "--workers", "1", "--rate-range", "1,2", "--cost", cost,
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"priced by {name}" in printed and line in printed
    assert json.loads(out.read_text())["cost_model"] == name


def test_fidelity_gpu_command_prints_both_tables(tmp_path, capsys):
    assert main(["fidelity-gpu", "--out", str(tmp_path), "--silicon-rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "a100-80gb    2 decode" in out
    assert "RTXPRO6000/Qwen3-32B" in out and "LLMServingSim err" in out
    assert (tmp_path / "gpu_steps.png").exists() and (tmp_path / "gpu_runs.png").exists()


def test_fidelity_gpu_replays_with_a_gpu_file_of_measured_all_reduces(tmp_path, capsys):
    """--gpu-file replaces the shipped GPU of its name: a slower PCIe all-reduce slows the
    two-GPU runs only."""
    from sim.specs.hardware import GPUS_DIR
    data = json.loads((GPUS_DIR / "rtx-pro-6000.json").read_text())
    path = tmp_path / "pro.json"
    path.write_text(json.dumps({**data, "allreduce": {"2": {"latency_s": 4e-5,
                                                            "bus_bytes_s": 1.6e10}}}))
    tables = {}
    for name, extra in (("shipped", []), ("measured", ["--gpu-file", str(path)])):
        assert main(["fidelity-gpu", "--out", str(tmp_path / name), "--silicon-rounds", "1",
                     *extra]) == 0
        capsys.readouterr()
        runs = json.loads((tmp_path / name / "gpu_fidelity.json").read_text())["runs"]
        tables[name] = {(r["run"], r["metric"]): r["ours"] for r in runs}
    key = ("RTXPRO6000/Qwen3-32B", "mean_tpot_ms")
    assert tables["measured"][key] > 1.1 * tables["shipped"][key]
    single = ("RTXPRO6000/Llama-3.1-8B", "mean_tpot_ms")
    assert tables["measured"][single] == tables["shipped"][single]


def test_fidelity_gpu_refuses_a_gpu_file_no_replay_runs_on(tmp_path, capsys):
    from sim.specs.hardware import GPUS_DIR
    path = tmp_path / "h20.json"
    path.write_text(json.dumps({**json.loads((GPUS_DIR / "h100.json").read_text()),
                                "name": "h20"}))
    assert main(["fidelity-gpu", "--out", str(tmp_path), "--gpu-file", str(path)]) == 2
    assert "GPU 'h20' runs none of the replays" in capsys.readouterr().err
