"""The prefix reuse ceiling: a hand-counted trace, a brute-force reference, traces without ids."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads import PREFIX_BLOCK_TOKENS, Trace, format_summary, summarize
from workloads.summary import prefix_reuse_ceiling

BLOCK = 16  # KV block tokens the hand counts below are in


def hand_counted() -> Trace:
    return Trace.from_arrays(
        "hand",
        arrival_s=[0.0, 1.0, 2.0, 3.0, 4.0],
        prompt_len=[1500, 1200, 600, 2000, 1024],
        output_len=[1, 1, 1, 1, 1],
        prefix_hash_ids=[[1, 2, 3], [1, 2, 4], [1, 2], [5, 1, 2, 3], [1, 2]],
    )


def test_ceiling_counts_the_longest_earlier_prefix_in_full_blocks() -> None:
    # Request 0 is first: nothing cached. 1 shares [1, 2] with 0: 1024 tokens. 2 shares
    # [1, 2], capped at 599 tokens -> 37 full blocks = 592. 3 starts with 5: nothing.
    # 4 shares [1, 2] but must compute its last token: 1023 -> 63 blocks = 1008.
    cached = 1024 + 592 + 0 + 1008
    assert prefix_reuse_ceiling(hand_counted(), BLOCK) == pytest.approx(cached / 6324)


def test_ceiling_with_blocks_as_large_as_a_hash_block() -> None:
    # The same matches in 512-token blocks: 1024, 512 (of 599), 0, 512 (of 1023).
    assert prefix_reuse_ceiling(hand_counted(), block_size=512) == pytest.approx(2048 / 6324)


def test_ceiling_is_zero_without_prefix_ids_and_the_summary_leaves_it_out() -> None:
    trace = Trace.from_arrays("plain", [0.0, 1.0], [600, 600], [1, 1])
    assert prefix_reuse_ceiling(trace, BLOCK) == 0.0
    summary = summarize(trace, BLOCK)
    assert summary.prefix_reuse_ceiling is None
    assert "prefix_ceiling" not in format_summary(summary)


def test_summary_prints_the_ceiling() -> None:
    summary = summarize(hand_counted(), BLOCK)
    assert summary.prefix_reuse_ceiling == pytest.approx(2624 / 6324)
    assert f"prefix_ceiling   {2624 / 6324:.4f}" in format_summary(summary)
    assert summary.to_dict()["prefix_reuse_ceiling"] == summary.prefix_reuse_ceiling


def test_ceiling_rejects_a_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        prefix_reuse_ceiling(hand_counted(), block_size=0)


def brute_force(ids: list[list[int]], prompt_len: list[int], block_size: int) -> float:
    cached = 0
    for i, row in enumerate(ids):
        k = max((_common(row, earlier) for earlier in ids[:i]), default=0)
        # Only whole KV blocks inside the shared tokens count, as the simulator shares them.
        cached += min(k * PREFIX_BLOCK_TOKENS, prompt_len[i] - 1) // block_size * block_size
    return cached / sum(prompt_len)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=12),
    data=st.data(),
    block_size=st.sampled_from([1, 16, 100, 512, 1024]),
)
def test_ceiling_matches_a_brute_force_count(rows, data, block_size) -> None:
    # Mooncake's layout: one id per started 512-token block of the prompt.
    prompt_len = [
        data.draw(st.integers((len(r) - 1) * PREFIX_BLOCK_TOKENS + 1, len(r) * PREFIX_BLOCK_TOKENS))
        for r in rows
    ]
    assert [math.ceil(n / PREFIX_BLOCK_TOKENS) for n in prompt_len] == [len(r) for r in rows]
    trace = Trace.from_arrays(
        "random",
        [float(i) for i in range(len(rows))],
        prompt_len,
        [1] * len(rows),
        prefix_hash_ids=rows,
    )
    expected = brute_force(rows, prompt_len, block_size)
    assert prefix_reuse_ceiling(trace, block_size) == pytest.approx(expected)
