"""Spec shapes: sessions, shared system prompts and load stages, drawn into traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workloads import load_trace, open_trace, save_trace
from workloads.summary import prefix_reuse_ceiling


def segments(trace, row: int) -> list[tuple[int, int]]:
    table = trace.table
    return list(zip(table["prefix_hash_ids"][row], table["prefix_hash_tokens"][row],
                    strict=True))


def test_turn_k_prompt_is_turn_k_minus_1_prompt_plus_its_answer_plus_a_new_question():
    trace = open_trace("synthetic:users=30,rate=2,turns=uniform(2,6),think=lognormal(10,0.5),"
                       "question=lognormal(200,0.5),output=uniform(20,300)", seed=3)
    table = trace.table
    checked = 0
    for _, rows in table.groupby("session_id"):
        rows = rows.sort_values("turn")
        assert rows["turn"].tolist() == list(range(len(rows)))
        for (i, before), (j, after) in zip(rows.iterrows(), list(rows.iterrows())[1:],
                                           strict=False):
            previous, current = segments(trace, i), segments(trace, j)
            assert current[: len(previous)] == previous  # the whole earlier prompt leads
            answer, question = current[len(previous)], current[len(previous) + 1]
            assert answer[1] == before["output_len"] and len(current) == len(previous) + 2
            assert after["prompt_len"] == before["prompt_len"] + before["output_len"] + question[1]
            assert after["think_s"] > 0 and after["arrival_s"] == pytest.approx(
                before["arrival_s"] + after["think_s"])
            checked += 1
    assert checked > 30
    assert (table.loc[table["turn"] == 0, "think_s"] == 0).all()


def test_max_len_drops_the_oldest_turns_and_keeps_the_system_prompt():
    trace = open_trace("synthetic:users=5,rate=1,turns=fixed(8),think=fixed(1),system=50,"
                       "question=fixed(100),output=fixed(100),max_len=600")
    table = trace.table
    assert (table["prompt_len"] + table["output_len"] <= 600).all()
    last = table[table["turn"] == 7].index[0]
    kept = segments(trace, last)
    # 50 + 2 x (100 + 100) + 100 + 100 > 600: one earlier turn fits beside the new question.
    assert kept[0][1] == 50 and len(kept) == 1 + 2 + 1


def test_shared_prefix_cycles_through_groups_times_prompts_distinct_prompts():
    trace = open_trace("synthetic:n=200,rate=10,system=100,groups=4,prompts=3,"
                       "question=uniform(50,80),output=fixed(10)", seed=1)
    ids = [tuple(row) for row in trace.table["prefix_hash_ids"]]
    assert len(set(ids)) == 12  # 4 x 3 distinct prompts
    assert ids[:12] == ids[12:24]  # the shuffled list, again and again
    assert len({row[0] for row in ids}) == 4
    assert {row[0] for row in trace.table["prefix_hash_tokens"]} == {100}


def test_constant_stages_send_rate_times_duration_evenly():
    trace = open_trace("synthetic:stages=rate(8,10)+rate(20,5),arrival=constant,prompt=fixed(64)")
    assert len(trace) == 80 + 100
    assert np.allclose(np.diff(trace.arrival_s[:80]), 1 / 8)
    assert trace.arrival_s[80] == pytest.approx(10.0)


def test_poisson_stages_keep_each_stage_within_its_duration():
    trace = open_trace("synthetic:stages=rate(50,20)+rate(5,20),prompt=fixed(64)", seed=2)
    first = (trace.arrival_s < 20).sum()
    assert 900 < first < 1100 and 60 < len(trace) - first < 150
    assert trace.arrival_s[-1] < 40


def test_a_concurrency_stage_records_its_users_as_sessions():
    trace = open_trace("synthetic:stages=concurrency(4,10),prompt=fixed(64)")
    assert trace.has_sessions and (trace.arrival_s == 0).all()
    assert sorted(set(trace.table["session_id"])) == [f"user-{u}" for u in range(4)]
    assert trace.table["turn"].max() == 2 and (trace.table["think_s"] == 0).all()


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_session_and_segment_columns_round_trip(tmp_path: Path, suffix: str):
    trace = open_trace("synthetic:users=4,rate=1,turns=fixed(3),think=fixed(2.5),system=17,"
                       "question=fixed(30),output=fixed(9)")
    save_trace(trace, tmp_path / f"t{suffix}")
    back = load_trace(tmp_path / f"t{suffix}")
    for column in ("session_id", "turn", "think_s", "prompt_len"):
        assert back.table[column].tolist() == trace.table[column].tolist()
    for column in ("prefix_hash_ids", "prefix_hash_tokens"):
        assert [list(map(int, r)) for r in back.table[column]] == trace.table[column].tolist()


def test_clipping_prompts_cuts_token_granular_prefixes():
    from workloads import clip_lengths

    trace = open_trace("synthetic:n=5,rate=1,system=100,question=fixed(200),output=fixed(5),"
                       "prompts=1")
    clipped = clip_lengths(trace, max_prompt_len=150)
    assert clipped.table["prefix_hash_tokens"].tolist()[0] == [100, 50]


def test_the_reuse_ceiling_of_inference_perfs_example_is_the_analytic_value():
    example = Path(__file__).parents[2] / "docs/examples/inference-perf-shared-prefix.yml"
    trace = open_trace(str(example))
    n = 8 * 600 + 20 * 600
    assert len(trace) == n
    # First pass over the 45 prompts: 4 of each group's 5 hit 6 blocks of the system
    # prompt; every later request repeats a whole prompt: 546 // 16 blocks of 16.
    analytic = (9 * 4 * 96 + (n - 45) * 544) / (547 * n)
    assert prefix_reuse_ceiling(trace, 16) == pytest.approx(analytic)


def test_the_summary_counts_sessions_turns_and_think_time():
    from workloads import format_summary, summarize

    trace = open_trace("synthetic:users=10,rate=1,turns=fixed(4),think=fixed(3),prompt=fixed(9)")
    summary = summarize(trace)
    assert (summary.sessions, summary.turns_mean, summary.think_s_mean) == (10, 4.0, 3.0)
    assert "sessions         10 (4.0 turns each, think 3.0 s mean)" in format_summary(summary)
