"""The bundled traces load and match the statistics published with them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workloads import BUNDLED, PREFIX_BLOCK_TOKENS, Trace, load_bundled, summarize


def test_conv_summary_matches_published_numbers(conv_trace: Trace) -> None:
    s = summarize(conv_trace)
    assert s.requests == 19_366
    assert round(s.span_s, 1) == 3501.7
    assert round(s.rate_per_s, 2) == 5.53
    assert round(s.interarrival_cv, 2) == 1.09
    assert (round(s.prompt_len_mean, 1), s.prompt_len_p50, s.prompt_len_p99) == (1154.7, 1020, 4142)
    assert (round(s.output_len_mean, 1), s.output_len_p50, s.output_len_p99) == (211.1, 129, 601)
    assert s.burst_peak_1s == 16
    assert (conv_trace.prompt_len.min(), conv_trace.prompt_len.max()) == (2, 14_050)
    assert (conv_trace.output_len.min(), conv_trace.output_len.max()) == (7, 1_000)
    assert s.prefix_blocks is None


def test_code_summary_matches_published_numbers(code_trace: Trace) -> None:
    s = summarize(code_trace)
    assert s.requests == 8_819
    assert round(s.span_s, 1) == 3435.9
    assert round(s.rate_per_s, 2) == 2.57
    assert round(s.interarrival_cv, 1) == 13.2
    assert (round(s.prompt_len_mean, 1), s.prompt_len_p50, s.prompt_len_p99) == (2047.8, 1469, 7436)
    assert (round(s.output_len_mean, 1), s.output_len_p50, round(s.output_len_p99, 1)) == (
        27.9,
        13,
        251.5,
    )
    assert s.burst_peak_1s == 67
    # The burst sits around t = 857..863 s from the start.
    assert 857 <= int(np.argmax(np.bincount(code_trace.arrival_s.astype(int)))) <= 863


def test_mooncake_summary_and_prefix_hashes(mooncake_trace: Trace) -> None:
    s = summarize(mooncake_trace, 16)  # the engine's KV blocks of 16 tokens
    assert s.requests == 3_993
    assert round(s.span_s, 1) == 1022.0
    assert round(s.rate_per_s, 2) == 3.91
    assert round(s.interarrival_cv, 2) == 1.01
    assert (round(s.prompt_len_mean, 1), s.prompt_len_p50, round(s.prompt_len_p99)) == (
        15325.5,
        11587,
        66456,
    )
    assert (round(s.output_len_mean, 1), s.output_len_p50, round(s.output_len_p99)) == (
        149.1,
        69,
        768,
    )
    assert (s.prefix_blocks, s.unique_prefix_blocks) == (121_877, 43_924)
    assert round(s.prefix_reuse_ceiling, 5) == 0.65121  # the simulator's unbounded-pool hit rate
    blocks = [len(ids) for ids in mooncake_trace.table["prefix_hash_ids"]]
    expected = [math.ceil(n / PREFIX_BLOCK_TOKENS) for n in mooncake_trace.prompt_len]
    assert blocks == expected


def test_mooncake_equal_timestamps_load_in_file_order(mooncake_trace: Trace) -> None:
    gaps = np.diff(mooncake_trace.arrival_s)
    assert (gaps == 0).sum() > 0  # about 0.3% of gaps are zero
    assert (gaps >= 0).all()


def test_azure_fraction_digits_are_exact(conv_trace: Trace) -> None:
    # 18:15:46.6805900 -> 18:15:50.9951690: 4.3145790 s, all 7 digits kept.
    assert conv_trace.arrival_s[1] == pytest.approx(4.314579, abs=1e-9)
    assert conv_trace.arrival_s[-1] == pytest.approx(3501.721937, abs=1e-9)


@pytest.mark.parametrize("name", list(BUNDLED))
def test_bundled_traces_have_the_schema(name: str) -> None:
    trace = load_bundled(name)
    table = trace.table
    assert table["arrival_s"].dtype == np.float64 and trace.arrival_s[0] == 0.0
    assert table["prompt_len"].dtype == np.int64 and table["output_len"].dtype == np.int64
    assert trace.request_ids[:3] == ["0", "1", "2"]
    assert len(set(trace.request_ids)) == len(trace)


def test_unknown_bundled_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="azure-conv"):
        load_bundled("azure-chat")
