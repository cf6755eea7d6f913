"""`vllm bench serve`'s flags: their parsing, the schedule they lay over a trace, and the
result keys computed from the client's records."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servelab.bench.vllm_flags import (
    parse_goodput,
    parse_metric_percentiles,
    parse_percentile_metrics,
    vllm_arrivals,
    vllm_schedule,
)
from servelab.bench.vllm_result import VllmReport, format_vllm_result, vllm_metrics
from sim.engine.core import FinishReason, Request
from workloads import open_trace


def test_goodput_reads_vllms_key_value_milliseconds():
    assert parse_goodput(["ttft:200", "tpot:50", "e2el:1e4"]) == {
        "ttft": 200.0, "tpot": 50.0, "e2el": 10000.0}


@pytest.mark.parametrize(("pairs", "message"), [
    (["ttft=200"], "KEY:VALUE"), (["ttft:fast"], "KEY:VALUE"), (["itl:5"], "'itl' is not"),
    (["tpot:-1"], ">= 0"),
])
def test_goodput_refuses_what_vllm_refuses(pairs, message):
    with pytest.raises(ValueError, match=message):
        parse_goodput(pairs)


def test_percentile_flags_parse_and_refuse_unknown_names():
    assert parse_percentile_metrics("ttft, e2el") == ("ttft", "e2el")
    assert parse_metric_percentiles("50,99.9") == (50.0, 99.9)
    with pytest.raises(ValueError, match="choose from"):
        parse_percentile_metrics("ttft,latency")
    with pytest.raises(ValueError, match=r"in \(0, 100\)"):
        parse_metric_percentiles("0,100")


def test_infinite_rate_sends_everything_at_once():
    assert vllm_arrivals(5, math.inf, 1.0, seed=0).tolist() == [0.0] * 5
    assert vllm_arrivals(5, math.inf, 0.25, seed=0).tolist() == [0.0] * 5


def vllm_get_request_delays(count: int, rate: float, burstiness: float, seed: int) -> list:
    """vLLM's get_request (no ramp-up) step by step: its seeded global numpy generator stood
    in for by a RandomState, one scalar draw per request, a running sum, the rescale."""
    numpy_global = np.random.RandomState(seed)
    delay_ts = []
    for _ in range(count):
        theta = 1.0 / (rate * burstiness)
        delay_ts.append(numpy_global.gamma(shape=burstiness, scale=theta))
    for i in range(1, len(delay_ts)):
        delay_ts[i] += delay_ts[i - 1]
    normalize_factor = (count / rate) / delay_ts[-1]
    return [delay * normalize_factor for delay in delay_ts]


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_arrivals_are_the_times_vllms_benchmark_draws_for_the_seed(burstiness):
    times = vllm_arrivals(50, 8.0, burstiness, seed=7)
    assert times.tolist() == vllm_get_request_delays(50, 8.0, burstiness, seed=7)
    # The first request waits its own interval; the last goes at count / rate exactly.
    assert times[0] > 0 and times[-1] == pytest.approx(50 / 8.0, rel=1e-12)


@pytest.mark.parametrize("burstiness", [0.25, 1.0])
def test_rate_sets_the_mean_interval_and_burstiness_its_spread(burstiness):
    times = vllm_arrivals(20_001, 10.0, burstiness, seed=1)
    gaps = np.diff(times)
    assert (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.1, rel=0.01)  # the rescale pins the total
    # A gamma of shape k has coefficient of variation 1/sqrt(k): 1 (Poisson) and 2.
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_infinite_burstiness_spaces_requests_evenly():
    assert np.diff(vllm_arrivals(5, 4.0, math.inf, seed=0)) == pytest.approx([0.25] * 4)


def test_schedule_takes_the_first_prompts_and_redraws_their_times():
    trace = open_trace("synthetic:n=50,rate=2,prompt=fixed(8),output=fixed(4)")
    same = vllm_schedule(trace, 10, None, 1.0, seed=0)
    assert same.arrival_s.tolist() == trace.arrival_s[:10].tolist()
    fast = vllm_schedule(trace, 10, 100.0, 1.0, seed=0)
    assert len(fast) == 10 and fast.span_s < trace.arrival_s[9]
    assert fast.arrival_s.tolist() == vllm_schedule(trace, 10, 100.0, 1.0, 0).arrival_s.tolist()
    # vLLM's gaps, counted from the first request (a trace starts at 0).
    vllm_times = vllm_arrivals(10, 100.0, 1.0, seed=0)
    assert fast.arrival_s.tolist() == (vllm_times - vllm_times[0]).tolist()


@pytest.mark.parametrize(("num_prompts", "rate", "burstiness", "message"), [
    (51, None, 1.0, "has only 50"), (0, None, 1.0, ">= 1"),
    (None, None, 0.5, "give both"), (None, 0.0, 1.0, "must be > 0"),
    (None, 2.0, 0.0, "--burstiness must be > 0"),
])
def test_schedule_refuses_bad_flags(num_prompts, rate, burstiness, message):
    trace = open_trace("synthetic:n=50,rate=2,prompt=fixed(8),output=fixed(4)")
    with pytest.raises(ValueError, match=message):
        vllm_schedule(trace, num_prompts, rate, burstiness, seed=0)


def record(request_id: str, arrival_s: float, token_times_s: list[float]) -> Request:
    r = Request(request_id, arrival_s, 10, len(token_times_s))
    r.token_times_s = token_times_s
    r.output_token_ids = [5] * len(token_times_s)
    r.finish_s, r.finish_reason = token_times_s[-1], FinishReason.LENGTH
    return r


def test_vllm_metrics_count_goodput_percentiles_and_peaks():
    # TTFTs 100 and 500 ms, TPOTs 100 and 500 ms; both in flight during second 0.
    requests = [record("a", 0.0, [0.1, 0.2, 0.3]), record("b", 0.0, [0.5, 1.0])]
    summary = {"duration_s": 1.0, "completed": 2, "total_input": 20, "total_output": 5,
               "request_throughput": 2.0, "output_throughput": 5.0,
               "total_token_throughput": 25.0}
    report = VllmReport(("ttft", "tpot"), (50.0, 99.9), (("ttft", 200.0),))
    result = vllm_metrics(requests, summary, report)
    assert result["request_goodput"] == 1.0  # only a meets TTFT <= 200 ms
    assert result["mean_ttft_ms"] == pytest.approx(300.0)
    assert result["std_ttft_ms"] == pytest.approx(200.0)
    assert result["p50_tpot_ms"] == pytest.approx(300.0)
    assert "p99.9_ttft_ms" in result and "mean_itl_ms" not in result
    assert result["max_output_tokens_per_s"] == 4.0  # four tokens in second 0
    assert result["max_concurrent_requests"] == 2
    printed = format_vllm_result(result, report, max_concurrency=None, rate=None)
    assert "Request goodput (req/s):                 1.00" in printed
    assert "P99.9 TTFT (ms):" in printed and "Inter-token Latency" not in printed
