"""Metric definitions on hand-built requests: TTFT from arrival, ITL gaps, TPOT, steps."""

from __future__ import annotations

import numpy as np
import pytest

from sim.engine.core import FinishReason, Request
from sim.replay.metrics import _stats, inter_token_latencies_ms, summarize
from sim.replay.simulation import RunResult


def _done(rid: str, arrival: float, times: list[float],
          reason: FinishReason = FinishReason.LENGTH) -> Request:
    request = Request(rid, arrival, prompt_len=4, max_new_tokens=max(len(times), 1))
    request.token_times_s = list(times)
    request.finish_reason = reason
    request.finish_s = times[-1] if times else arrival
    return request


def test_itl_is_gaps_within_each_request_never_across_two():
    requests = [
        _done("a", 0.0, [1.0, 1.5, 2.5]),
        _done("b", 0.0, [3.0]),  # one token: no gap
        _done("c", 0.5, [10.0, 10.25]),
        _done("d", 0.0, [4.0, 9.0], FinishReason.ABORTED),  # not completed: left out
        _done("e", 1.0, [20.0, 20.1, 20.2, 20.4]),
    ]
    expected = np.concatenate([np.diff(r.token_times_s) for r in requests
                               if r.finish_reason is FinishReason.LENGTH]) * 1e3
    np.testing.assert_allclose(inter_token_latencies_ms(requests), expected)
    np.testing.assert_allclose(expected, [500, 1000, 250, 100, 100, 200])


def test_summary_counts_ttft_from_arrival_and_steps_time_weighted():
    requests = [_done("a", 0.0, [2.0, 2.5, 3.0]), _done("b", 1.0, [1.5, 4.5])]
    # start, duration, batch, tokens, prefill, decode, padding, kv, waiting, running, preempted
    steps = [(0.0, 1.0, 2, 10, 8, 2, 0, 10, 0, 2, 0), (1.0, 3.0, 2, 2, 0, 2, 1, 20, 0, 1, 0)]
    summary = summarize(RunResult(requests, steps, num_preemptions=0, num_blocks=40,
                                  max_num_seqs=4))
    assert summary["mean_ttft_ms"] == pytest.approx((2000 + 500) / 2)
    assert summary["mean_tpot_ms"] == pytest.approx((500 + 3000) / 2)
    assert summary["mean_itl_ms"] == pytest.approx((500 + 500 + 3000) / 3)
    assert summary["duration_s"] == pytest.approx(4.5)
    assert summary["mean_kv_usage"] == pytest.approx((0.25 * 1 + 0.5 * 3) / 4)
    assert summary["slot_utilization"] == pytest.approx(3 / 4)
    assert summary["num_steps"] == 2 and summary["max_batch_size"] == 2


@pytest.mark.parametrize("values", [[3.0, 1.0, 2.0, 9.0, 4.0], [3.0, np.nan, 1.0, 9.0, 2.0]])
def test_latency_stats_are_numpys_and_leave_the_callers_array_as_it_was(values):
    """_stats partitions its own copy in place (a run's gaps are gigabytes): the caller's
    array keeps its order, and the mean is taken in that order, before the partition."""
    given = np.array(values)
    out: dict = {}
    _stats("itl", given, out)
    np.testing.assert_array_equal(given, values)
    finite = given[~np.isnan(given)]
    assert out["mean_itl_ms"] == float(finite.mean())
    assert out["p99_itl_ms"] == float(np.percentile(finite, 99))
    assert out["median_itl_ms"] == float(np.percentile(finite, 50))
