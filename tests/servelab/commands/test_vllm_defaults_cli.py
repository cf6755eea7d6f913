"""A deployment the user names runs with vLLM's limits for its GPU; the bundled-trace default
keeps the lab's; --request-rate replays a trace at a rate."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servelab.cli import build_parser, main
from servelab.trace_args import load_trace_from_args
from sim.specs.engine_limits import ENGINE_DEFAULTS, vllm_server_limits
from sim.specs.hardware import hardware_spec

TRACE = ["--trace", "azure-code", "--max-requests", "30"]


@pytest.mark.parametrize(("gpu", "seqs", "tokens"), [
    ("h100", 1024, 8192), ("h200", 1024, 8192), ("b200", 1024, 8192),
    ("rtx-pro-6000", 1024, 8192), ("a100-80gb", 256, 2048), ("l40s", 256, 2048),
    ("rtx-4090", 256, 2048), ("b300", 1024, 8192), ("gb200", 1024, 8192),
    ("h100-pcie", 1024, 8192), ("a100-80gb-pcie", 256, 2048), ("l4", 256, 2048)])
def test_vllm_server_limits_follow_the_gpu(gpu, seqs, tokens):
    spec = hardware_spec(gpu)
    limits = vllm_server_limits(spec.name, spec.memory_bytes, 131072)
    assert (limits.max_num_seqs, limits.token_budget, limits.max_model_len) == (
        seqs, tokens, 131072)
    assert limits.vllm and limits.block_size == ENGINE_DEFAULTS.block_size


def _config(tmp_path, *flags: str) -> dict:
    out = tmp_path / "run.json"
    assert main(["simulate", *TRACE, *flags, "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    (policy, config), = payload["config"]["scheduler"].items()
    return {"policy": policy, **config, "context": payload["deployment_spec"]["model"][
        "max_position_embeddings"]}


def test_naming_the_gpu_takes_vllms_limits_and_chunked(tmp_path, capsys):
    config = _config(tmp_path, "--hardware", "h200", "--model", "meta-llama/Llama-3.1-8B")
    assert config["policy"] == "chunked"
    assert (config["max_num_seqs"], config["token_budget"]) == (1024, 8192)
    assert config["max_model_len"] == config["context"] == 131072
    assert "vLLM's defaults for this GPU" in capsys.readouterr().out


def test_a_smaller_gpu_takes_vllms_smaller_limits(tmp_path):
    config = _config(tmp_path, "--hardware", "l40s")
    assert (config["policy"], config["max_num_seqs"], config["token_budget"]) == (
        "chunked", 256, 2048)


def test_without_a_named_deployment_the_lab_defaults_stay(tmp_path, capsys):
    config = _config(tmp_path)
    assert config["policy"] == "continuous"
    assert config["max_num_seqs"] == ENGINE_DEFAULTS.max_num_seqs
    assert config["max_model_len"] == min(config["context"], ENGINE_DEFAULTS.max_model_len)
    assert "servelab's CPU-lab defaults" in capsys.readouterr().out


def test_a_flag_given_beats_vllms_default(tmp_path):
    config = _config(tmp_path, "--hardware", "h100", "--max-num-seqs", "64",
                     "--max-num-batched-tokens", "16384", "--policy", "continuous")
    assert (config["policy"], config["max_num_seqs"]) == ("continuous", 64)
    assert config["token_budget"] == 16384


def _trace(*flags: str):
    return load_trace_from_args(build_parser().parse_args(["simulate", *flags]))


def test_request_rate_scales_a_trace_file_to_that_rate():
    own = _trace(*TRACE)
    fast = _trace(*TRACE, "--request-rate", "10")
    assert len(fast) / fast.span_s == pytest.approx(10.0)
    # The shape is kept: every gap shrinks by one factor.
    ratio = np.diff(fast.arrival_s) / np.diff(own.arrival_s)
    assert np.allclose(ratio[np.isfinite(ratio)], ratio[np.isfinite(ratio)][0])


def test_request_rate_draws_vllms_arrivals_for_a_generated_workload():
    spec = "synthetic:n=400,rate=1,prompt=fixed(64),output=fixed(8)"
    trace = _trace("--trace", spec, "--request-rate", "20", "--burstiness", "0.5")
    assert len(trace) / trace.span_s == pytest.approx(20.0, rel=0.25)
    at_once = _trace("--trace", spec, "--request-rate", "inf")
    assert at_once.span_s == 0.0


@pytest.mark.parametrize(("flags", "needle"), [
    (["--request-rate", "4", "--qps-scale", "2"], "not both"),
    (["--request-rate", "4", "--burstiness", "0.5"], "generated workload"),
    (["--burstiness", "2"], "generated workload")])
def test_request_rate_refuses_what_it_cannot_mean(flags, needle, capsys):
    assert main(["simulate", *TRACE, *flags]) == 2
    assert needle in capsys.readouterr().err


def test_goodput_and_p99_targets_speak_one_family(tmp_path, capsys):
    out = tmp_path / "slo.json"
    argv = ["simulate", *TRACE, "--policy", "chunked", "--goodput", "ttft:500", "tpot:50",
            "--slo-ttft-p99-ms", "1", "--slo-itl-p99-ms", "1000", "--json", str(out)]
    assert main(argv) == 0
    assert "chunked: misses the SLO (p99_ttft" in capsys.readouterr().out
    payload = json.loads(out.read_text())
    assert payload["config"]["slo"] == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert payload["results"]["chunked"]["slo_p99_held"] is False
    # The old spelling is a hidden alias of the same bound.
    old = tmp_path / "old.json"
    assert main(["simulate", *TRACE, "--policy", "chunked", "--slo-ttft-ms", "500",
                 "--slo-tpot-ms", "50", "--json", str(old)]) == 0
    assert json.loads(old.read_text())["results"]["chunked"]["goodput"] == payload["results"][
        "chunked"]["goodput"]


def test_sweep_keeps_its_old_capacity_spelling():
    args = build_parser().parse_args(["sweep", *TRACE, "--capacity-ttft-p99-ms", "300"])
    assert (args.slo_ttft_p99_ms, args.slo_itl_p99_ms) == (300.0, 200.0)


def test_sweep_grid_defaults_follow_the_named_gpu(tmp_path):
    out = tmp_path / "sweep.json"
    assert main(["sweep", *TRACE, "--policies", "chunked", "--qps-scales", "1", "--hardware",
                 "h200", "--workers", "1", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["token_budget"], row["max_num_seqs"]) == (8192, 1024)
