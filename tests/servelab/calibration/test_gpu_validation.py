"""The GPU validation data loads, and the validation command runs end to end."""

from __future__ import annotations

from servelab.calibration.gpu_profiles import lss_samples, vidur_allreduce
from servelab.calibration.gpu_replay import METRICS, load_runs
from servelab.calibration.splitwise import splitwise_steps


def test_splitwise_loader_gives_both_phases_for_every_cell():
    steps = splitwise_steps(model="llama-2-70b")
    cells = {(s.gpu, s.tp, s.phase) for s in steps}
    assert cells == {(g, tp, p) for g in ("a100-80gb", "h100") for tp in (2, 4, 8)
                     for p in ("prefill", "decode")}
    assert all(s.measured_s > 0 for s in steps)
    assert not any(s.batch == 64 and s.phase == "prefill" for s in steps)


def test_llmservingsim_runs_parse_with_their_peer_numbers():
    runs = load_runs()
    assert len(runs) == 4
    for run in runs:
        assert len(run.requests) == 300
        assert set(run.vllm) == set(run.peer) == set(METRICS.values())
        assert run.requests[0][0] == 0.0


def test_operator_profiles_parse():
    kinds = {s.kind for s in lss_samples()}
    assert {"gemm", "small", "attn_prefill", "attn_decode", "sampler", "moe"} <= kinds
    assert {gpu for gpu, *_ in vidur_allreduce()} == {"a100-80gb", "h100"}
