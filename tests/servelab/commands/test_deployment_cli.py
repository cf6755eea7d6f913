"""Models, GPUs and vLLM's flags through the CLI: every shipped config simulates, config.json
paths do, an unpriced config ends in one line and exit 2, and the four vLLM runs replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.calibration.gpu_replay import RUNS_DIR
from servelab.cli import main
from sim.deployment import DeploymentOptions, build_deployment
from sim.specs.model_config import MODELS_DIR, shipped_model_ids

TINY = "synthetic:n=20,rate=5,prompt=fixed(200),output=fixed(16)"


def _fitting(model: str) -> list[str]:
    """--hardware and --tp of the smallest H200 deployment that holds the model."""
    for tp in (1, 2, 4, 8):
        try:
            build_deployment(DeploymentOptions(model, "h200", tensor_parallel=tp))
        except ValueError:
            continue
        return ["--hardware", "h200", "--tp", str(tp)]
    raise AssertionError(f"{model} fits no H200 deployment")


@pytest.mark.parametrize("model", shipped_model_ids())
def test_simulate_runs_every_shipped_config(model: str, capsys) -> None:
    assert main(["simulate", "--trace", TINY, "--model", model, *_fitting(model)]) == 0
    out = capsys.readouterr().out
    assert model in out and "KV pool:" in out


@pytest.mark.parametrize("gpu", ["b300", "gb200", "h100-pcie", "a100-80gb-pcie", "l4"])
def test_simulate_runs_on_the_aiconfigurator_systems_from_their_datasheets(gpu: str,
                                                                          capsys) -> None:
    """No kernel tables or profiles for these GPUs: the fitted model, scaled by the file."""
    trace = "synthetic:n=20,rate=5,prompt=fixed(300),output=fixed(20)"
    assert main(["simulate", "--trace", trace, "--hardware", gpu]) == 0
    out = capsys.readouterr().out
    assert f"llama-3-8b on {gpu} (bf16); priced by gpu-fitted: no measured vLLM kernels" in out
    assert "extrapolated from the datasheet" in out and "KV pool:" in out


def _deployment_spec(tmp_path: Path, capsys, *flags: str) -> dict:
    """`simulate` of the tiny trace with these flags: the deployment its --json records."""
    argv = ["simulate", "--trace", TINY, *flags, "--json", str(tmp_path / "r.json")]
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads((tmp_path / "r.json").read_text())["deployment_spec"]


@pytest.mark.parametrize("hf_id", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B",
                                   "Qwen/Qwen3-8B", "mistralai/Mistral-7B-v0.3",
                                   "mistralai/Mixtral-8x7B-v0.1", "Qwen/Qwen3-30B-A3B"])
def test_simulate_runs_a_config_json_path(hf_id: str, tmp_path: Path, capsys) -> None:
    config = json.loads((MODELS_DIR / (hf_id.replace("/", "--") + ".json")).read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = _deployment_spec(tmp_path, capsys, "--model", str(tmp_path / "config.json"),
                            "--hardware", "h200")
    assert spec["model"]["num_layers"] == config["num_hidden_layers"]


def test_quantization_fp8_as_vllm_spells_it(tmp_path: Path, capsys) -> None:
    """`simulate -q fp8` prices FP8 weights and records it; `plan` replays it the same way;
    an FP8 checkpoint's config is read as FP8 weights, another scheme refused by name."""
    spec = _deployment_spec(tmp_path, capsys, "--model", "meta-llama/Llama-3.1-70B-Instruct",
                            "--tensor-parallel-size", "2", "--quantization", "fp8")
    assert spec["quantization"] == "fp8" and "fp8 weights" in spec["description"]
    argv = ["plan", "--trace", TINY, "--hardware", "h100", "--tp", "1", "--pd-ratios", "",
            "--workers", "1", "--rate-range", "1,2", "-q", "fp8",
            "--json", str(tmp_path / "plan.json")]
    assert main(argv) == 0, capsys.readouterr().err
    row = json.loads((tmp_path / "plan.json").read_text())["cheapest"][0]
    assert row["simulate_args"][-2:] == ["--quantization", "fp8"]
    refused = main(["simulate", "--trace", TINY, "--quantization", "int4"])
    assert refused == 2 and "invalid choice: 'int4'" in capsys.readouterr().err
    config = json.loads((MODELS_DIR / "meta-llama--Llama-3.1-8B.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8"}  # an FP8 checkpoint: as vLLM
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert _deployment_spec(tmp_path, capsys, "--model", str(tmp_path))["quantization"] == "fp8"
    config["quantization_config"] = {"quant_method": "awq"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["simulate", "--trace", TINY, "--model", str(tmp_path)]) == 2
    assert "quant_method 'awq'" in capsys.readouterr().err


def test_an_unpriced_mechanism_ends_in_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text(json.dumps({  # hybrid linear attention
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                        "full_attention"] * 12, "linear_conv_kernel_dim": 4,
        "vocab_size": 151936}))
    assert main(["simulate", "--trace", TINY, "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "linear_conv_kernel_dim" in err[0]


def test_deepseek_v3_runs_as_vllm_serves_it(tmp_path: Path, capsys) -> None:
    """DeepSeek-V3's FP8 checkpoint on 8 H200s at TP 8: its latent KV cache, whole on every
    GPU, sizes the pool; the line says what is extrapolated."""
    spec = _deployment_spec(tmp_path, capsys, "--model", "deepseek-ai/DeepSeek-V3",
                            "--hardware", "h200", "--tensor-parallel-size", "8")
    assert spec["quantization"] == "fp8" and "latent attention" in spec["description"]
    assert spec["kv_pool"]["block_bytes"] == 61 * (512 + 64) * 2 * 16


def test_vllm_flag_names_configure_what_servelab_names_do(tmp_path: Path, capsys) -> None:
    common = ["simulate", "--trace", TINY, "--policy", "chunked"]
    ours = [*common, "--tp", "2", "--token-budget", "4096", "--dtype", "bf16"]
    vllm = [*common, "--tensor-parallel-size", "2", "--max-num-batched-tokens", "4096",
            "--dtype", "bfloat16"]
    for name, argv in (("a", ours), ("b", vllm)):
        assert main([*argv, "--json", str(tmp_path / f"{name}.json")]) == 0
    first, second = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    assert first == second
    assert first["config"]["scheduler"]["chunked"]["token_budget"] == 4096


@pytest.mark.parametrize(("run", "flags"), [
    ("RTX4090/Llama-3.1-8B", ["--model", "meta-llama/Llama-3.1-8B", "--hardware", "rtx-4090",
                              "--max-num-seqs", "256", "--max-model-len", "32768"]),
    ("RTXPRO6000/Llama-3.1-8B", ["--model", "meta-llama/Llama-3.1-8B", "--hardware",
                                 "rtx-pro-6000", "--max-num-seqs", "128"]),
    ("RTXPRO6000/Qwen3-32B", ["--model", "Qwen/Qwen3-32B", "--hardware", "rtx-pro-6000",
                              "--tensor-parallel-size", "2", "--max-num-seqs", "128"]),
    ("RTXPRO6000/Qwen3-30B-A3B-Instruct-2507", [
        "--model", "Qwen/Qwen3-30B-A3B-Instruct-2507", "--hardware", "rtx-pro-6000",
        "--data-parallel-size", "2", "--enable-expert-parallel", "--max-num-seqs", "128"]),
])
def test_the_four_vllm_runs_replay_with_their_engine_args(run: str, flags: list[str],
                                                          tmp_path: Path, capsys) -> None:
    folder = RUNS_DIR / run / "vllm"
    meta = json.loads((folder / "meta.json").read_text())
    assert flags[1] == meta["model"]
    argv = ["simulate", "--trace", str(folder / "requests.jsonl"), "--policy", "chunked",
            "--max-num-batched-tokens", "2048", "--dtype", "bfloat16", *flags,
            "--json", str(tmp_path / "r.json")]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "KV pool:" in out
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["trace"]["requests"] == meta["num_requests"]
    parallel = result["deployment_spec"]["parallel"]
    engine = meta["engine_kwargs"]
    assert parallel == {"tensor_parallel": engine["tensor_parallel_size"],
                        "data_parallel": engine["data_parallel_size"],
                        "expert_parallel": engine["enable_expert_parallel"]}


def test_hardware_and_models_list_what_the_flags_take(capsys) -> None:
    assert main(["hardware"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in ("b200", "l40s", "rtx-4090", "rtx-pro-6000",
                                            "b300", "gb200", "h100-pcie", "l4"))
    assert main(["hardware", "l40s"]) == 0 and "datasheet" in capsys.readouterr().out
    assert main(["models"]) == 0
    listing = capsys.readouterr().out
    assert "Qwen/Qwen3-235B-A22B" in listing and "llama-3-8b" in listing


def test_plan_searches_data_parallel_with_experts_for_an_moe_model(tmp_path: Path,
                                                                   capsys) -> None:
    argv = ["plan", "--trace", "synthetic:n=200,rate=8,prompt=fixed(500),output=fixed(32)",
            "--model", "Qwen/Qwen3-30B-A3B", "--hardware", "rtx-pro-6000", "--tp", "1",
            "--pd-ratios", "", "--workers", "1", "--top", "10", "--rate-range", "1,2",
            "--json", str(tmp_path / "plan.json")]
    assert main(argv) == 0, capsys.readouterr().err
    rows = json.loads((tmp_path / "plan.json").read_text())["cheapest"]
    by_dp = {row["dp"]: row for row in rows}
    assert set(by_dp) == {1, 2, 4}
    assert "--enable-expert-parallel" in by_dp[2]["simulate_args"]
    assert by_dp[4]["gpus"] == 4 * by_dp[4]["scale"]


def test_plan_refuses_data_parallel_for_a_dense_model(capsys) -> None:
    argv = ["plan", "--trace", TINY, "--data-parallel-size", "1,2"]
    assert main(argv) == 2
    assert "no experts" in capsys.readouterr().err


def test_serve_simulate_takes_vllm_flags() -> None:
    from servelab.cli import build_parser
    from servelab.commands.serve import _simulated_parts
    from servelab.serve.tokenizer import load_tokenizer

    args = build_parser().parse_args([
        "serve", "--simulate", "--model", "Qwen/Qwen3-32B", "--hardware", "rtx-pro-6000",
        "--tensor-parallel-size", "2", "--dtype", "bfloat16", "--gpu-memory-utilization",
        "0.8", "--max-num-batched-tokens", "4096", "--policy", "chunked"])
    parts = _simulated_parts(args, load_tokenizer(None))
    # A named deployment takes vLLM's limits for a 96 GiB GPU: 1024 sequences, the model's
    # whole context; the memory profile runs the budget given.
    expected = build_deployment(DeploymentOptions(
        "Qwen/Qwen3-32B", "rtx-pro-6000", tensor_parallel=2, gpu_memory_utilization=0.8,
        max_num_batched_tokens=4096, vllm_defaults=True))
    assert parts.scheduler.config.num_blocks == expected.kv_pool.num_blocks
    assert parts.scheduler.config.budget == 4096
    assert parts.scheduler.config.max_num_seqs == 1024
    assert parts.scheduler.config.max_model_len == expected.model.max_position_embeddings
    assert "2x rtx-pro-6000" in parts.where
