"""Transforms return new traces with the asked-for change and leave their input alone."""

from __future__ import annotations

import numpy as np
import pytest

from workloads import (
    Trace,
    TraceTransforms,
    clip_lengths,
    head,
    scale_lengths,
    scale_qps,
    summarize,
    time_window,
)


def small() -> Trace:
    return Trace.from_arrays(
        "small",
        arrival_s=[0.0, 1.0, 2.5, 2.5, 4.0],
        prompt_len=[1, 600, 1024, 1500, 10],
        output_len=[3, 5, 1, 8, 2],
        request_ids=["a", "b", "c", "d", "e"],
        prefix_hash_ids=[[1], [1, 2], [1, 2], [1, 2, 3], [4]],
    )


def test_head_keeps_the_first_n() -> None:
    assert head(small(), 2).request_ids == ["a", "b"]
    assert len(head(small(), 99)) == 5


def test_time_window_is_half_open_and_rezeroed() -> None:
    window = time_window(small(), 1.0, 4.0)
    assert window.request_ids == ["b", "c", "d"]
    np.testing.assert_array_equal(window.arrival_s, [0.0, 1.5, 1.5])
    assert time_window(small(), 2.0).request_ids == ["c", "d", "e"]
    with pytest.raises(ValueError, match=r"no requests in the window \[4.5, None\)"):
        time_window(small(), 4.5)


def test_qps_scale_multiplies_the_rate(conv_trace: Trace) -> None:
    faster = scale_qps(conv_trace, 2.0)
    assert summarize(faster).rate_per_s == pytest.approx(2 * summarize(conv_trace).rate_per_s)
    assert faster.span_s == pytest.approx(conv_trace.span_s / 2)
    np.testing.assert_array_equal(faster.prompt_len, conv_trace.prompt_len)


def test_length_scale_rounds_and_keeps_at_least_one() -> None:
    scaled = scale_lengths(small(), 0.25)
    assert scaled.prompt_len.tolist() == [1, 150, 256, 375, 3]  # 0.25 -> 1 (floor), 2.5 -> 3
    assert scaled.output_len.tolist() == [1, 1, 1, 2, 1]
    # prefix blocks beyond the shorter prompt are dropped: 375 tokens -> one 512-token block
    assert scaled.table["prefix_hash_ids"].tolist() == [[1], [1], [1], [1], [4]]


def test_prompt_and_output_scales_multiply_the_length_scale() -> None:
    # prompts x0.5 x0.5, outputs x0.5 x4: long prompts shrunk, short outputs kept usable
    out = TraceTransforms(length_scale=0.5, prompt_scale=0.5, output_scale=4).apply(small())
    assert out.prompt_len.tolist() == scale_lengths(small(), 0.25).prompt_len.tolist()
    assert out.output_len.tolist() == (small().output_len * 2).tolist()
    with pytest.raises(ValueError, match="length scale must be a positive number, got -1"):
        scale_lengths(small(), 0.5, -1)


def test_clipping_caps_lengths_and_prefix_blocks() -> None:
    clipped = clip_lengths(small(), max_prompt_len=1000, max_output_len=4)
    assert clipped.prompt_len.tolist() == [1, 600, 1000, 1000, 10]
    assert clipped.output_len.tolist() == [3, 4, 1, 4, 2]
    assert clipped.table["prefix_hash_ids"].tolist() == [[1], [1, 2], [1, 2], [1, 2], [4]]


def test_transforms_never_mutate_their_input() -> None:
    trace = small()
    before = trace.table.copy(deep=True)
    TraceTransforms(
        start_s=1.0,
        max_requests=2,
        qps_scale=3,
        length_scale=0.5,
        max_prompt_len=100,
        max_output_len=1,
    ).apply(trace)
    assert trace.table.equals(before)


def test_transforms_apply_in_documented_order() -> None:
    # window [1, inf) first (b, c, d, e), then the first 2, then rate x2, then lengths.
    out = TraceTransforms(
        start_s=1.0, max_requests=2, qps_scale=2.0, length_scale=2.0, max_prompt_len=1100
    ).apply(small())
    assert out.request_ids == ["b", "c"]
    np.testing.assert_array_equal(out.arrival_s, [0.0, 0.75])
    assert out.prompt_len.tolist() == [1100, 1100] and out.output_len.tolist() == [10, 2]


def test_default_transforms_return_the_same_trace() -> None:
    trace = small()
    assert TraceTransforms().apply(trace) is trace


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"max_requests": 0}, "max_requests must be >= 1"),
        ({"qps_scale": 0}, "qps_scale must be a positive number"),
        ({"length_scale": float("nan")}, "length_scale must be a positive number"),
        ({"output_scale": 0}, "output_scale must be a positive number"),
        ({"max_prompt_len": -1}, "max_prompt_len must be >= 1"),
        ({"start_s": -1}, "start_s must be >= 0"),
        ({"start_s": 5, "end_s": 5}, "end_s must be > start_s"),
    ],
)
def test_bad_transform_values_raise(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        TraceTransforms(**kwargs)
