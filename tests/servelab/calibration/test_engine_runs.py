"""Whole vLLM runs priced with given vLLM terms: each run's host scheduling follows its
measured version."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servelab.calibration.engine_runs import run_samples, silicon_samples
from sim.cost.engine_overhead import async_scheduling, load_vllm
from sim.measured.silicon_rows import load_rows

NO_HOST = replace(load_vllm(), step_s=0.0, per_row_s=0.0, piecewise_layer_s=0.0, request_s=0.0)


@pytest.fixture(scope="module")
def silicon():
    slow_host = replace(NO_HOST, step_s=5e-3)
    return {name: {s.name: s for s in silicon_samples(engine, "gpu", 1, versioned)}
            for name, engine, versioned in (("bare", NO_HOST, True), ("slow", slow_host, True),
                                            ("overlapped", slow_host, False))}


def test_rows_of_a_vllm_without_async_scheduling_add_the_host_step_to_every_token(silicon):
    serial = [n for n, s in silicon["bare"].items() if not async_scheduling(s.version)]
    assert serial  # the Qwen3-32B rows ran vLLM 0.12
    for name in serial:
        extra_ms = silicon["slow"][name].tpot_ms - silicon["bare"][name].tpot_ms
        # Every step between a row's tokens runs 5 ms more; steps that also prefill other
        # rows' prompts stretch the queue a little further.
        assert 4.95 <= extra_ms <= 6.25
        assert silicon["overlapped"][name].tpot_ms < silicon["slow"][name].tpot_ms


def test_llmservingsim_runs_keep_their_whole_summaries():
    done = run_samples(NO_HOST, "gpu")
    assert len(done) == 4 and all(s.version and async_scheduling(s.version) for s in done)
    assert all(s.summary["mean_ttft_ms"] == s.ttft_ms for s in done)


def test_every_row_the_replay_prices_is_priced_gpt_oss_checkpoint_included(silicon):
    # gpt-oss's rows say fp4; vLLM served its MXFP4 checkpoint as it is (row_plan), as
    # fidelity-gpu replays them.
    assert len(silicon["bare"]) == len(load_rows())
    assert any("gpt_oss" in name for name in silicon["bare"])
