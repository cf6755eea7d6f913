"""`plan` finds the same cheapest deployments whether it stops certain failures early and
prunes dear deployments or runs every probe of the full search to its end; each GPU's engine
runs vLLM's default limits for it unless the flags give them."""

from __future__ import annotations

import json

from servelab.cli import main
from sim.specs.engine_limits import vllm_server_limits
from sim.specs.hardware import hardware_spec

TRACE = ["--trace", "azure-conv", "--max-requests", "300", "--qps-scale", "12"]
SPACE = ["--hardware", "h100,a100-80gb", "--tp", "1,2", "--pd-ratios", "1:1", "--top", "3",
         "--workers", "1", "--rate-range", "1,4"]
KEYS = ("deployment", "scale", "engines", "gpus", "usd_per_hour", "p99_ttft_ms", "p99_itl_ms")


def _plan(tmp_path, capsys, *extra: str) -> tuple[dict, str]:
    path = tmp_path / f"plan{len(extra)}.json"
    assert main(["plan", *TRACE, *SPACE, "--json", str(path), *extra]) == 0
    return json.loads(path.read_text()), capsys.readouterr().out


def test_plan_answers_the_same_with_and_without_early_stops_and_pruning(tmp_path, capsys):
    fast, out = _plan(tmp_path, capsys)
    full, full_out = _plan(tmp_path, capsys, "--exhaustive")
    for key in ("cheapest_per_hardware", "cheapest"):
        assert [[row[k] for k in KEYS] for row in fast[key]] == \
            [[row[k] for k in KEYS] for row in full[key]]
    assert [row["max_qps_scale"] for row in fast["cheapest_per_hardware"]] == \
        [row["max_qps_scale"] for row in full["cheapest_per_hardware"]]
    assert full["runs"]["stopped"] == full["runs"]["skipped"] == 0
    assert fast["runs"]["stopped"] > 0
    assert fast["runs"]["started"] + fast["runs"]["skipped"] <= full["runs"]["started"]
    for text in (out, full_out):
        assert "NaN" not in text and "nan" not in text
        assert "stopped early" in text
    searched = {row["deployment"] for row in fast["cheapest_per_hardware"]}
    for row in fast["cheapest"]:
        if row["deployment"] not in searched:
            assert row["max_rate_rps"].startswith("not searched (")


SMALL = ["--trace", "azure-conv", "--max-requests", "60", "--hardware", "h100,l40s", "--tp", "1",
         "--pd-ratios", "", "--workers", "1", "--rate-range", "1,2"]


def _engines(tmp_path, capsys, *extra: str) -> tuple[dict, str]:
    path = tmp_path / "engines.json"
    assert main(["plan", *SMALL, "--json", str(path), *extra]) == 0
    return json.loads(path.read_text()), capsys.readouterr().out


def test_plan_runs_each_gpu_with_vllms_defaults_for_it_and_says_so(tmp_path, capsys):
    plan, out = _engines(tmp_path, capsys)
    expected = {}
    for name in ("h100", "l40s"):  # 80 GiB and 48 GiB: two memory classes
        spec = hardware_spec(name)
        limits = vllm_server_limits(spec.name, spec.memory_bytes, 8192)  # llama-3-8b's context
        expected[name] = {"max_num_seqs": limits.max_num_seqs, "token_budget": limits.token_budget,
                          "max_num_batched_tokens": limits.token_budget,
                          "max_model_len": limits.max_model_len}
        assert (f"  {name}: max_num_seqs {limits.max_num_seqs}, max_num_batched_tokens "
                f"{limits.token_budget}, max_model_len 8192") in out
    assert expected["h100"] != expected["l40s"]
    assert plan["engine_per_hardware"] == {name: [row] for name, row in expected.items()}
    for row in plan["cheapest"]:  # each candidate records the limits it ran with
        assert {k: row[k] for k in expected[row["hardware"]]} == expected[row["hardware"]]
        assert row["simulate_args"][row["simulate_args"].index("--max-num-seqs") + 1] == \
            str(expected[row["hardware"]]["max_num_seqs"])


def test_plan_limits_given_override_every_gpus_defaults(tmp_path, capsys):
    plan, out = _engines(tmp_path, capsys, "--max-num-seqs", "128",
                         "--max-num-batched-tokens", "4096")
    given = {"max_num_seqs": 128, "token_budget": 4096, "max_num_batched_tokens": 4096,
             "max_model_len": 8192}
    assert plan["engine_per_hardware"] == {"h100": [given], "l40s": [given]}
    assert "  l40s: max_num_seqs 128, max_num_batched_tokens 4096, max_model_len 8192" in out
    assert all(row["max_num_seqs"] == 128 for row in plan["cheapest"])


def test_plan_refuses_a_budget_below_a_gpus_default_sequence_cap(capsys):
    # vLLM refuses max_num_batched_tokens below max_num_seqs; H100's default cap is 1024.
    assert main(["plan", *SMALL, "--max-num-batched-tokens", "512"]) == 2
    assert "h100 tp1 co-located least-requests: token_budget 512 < max_num_seqs 1024" in \
        capsys.readouterr().err
