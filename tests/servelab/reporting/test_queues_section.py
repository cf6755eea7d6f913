"""The queue-orders report section on small overloaded traces: the orders do what they
promise, aging bounds overtaking, swap keeps the victims' KV, and the files are written."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.reporting.charts.queue_charts import NO_CACHE, SWAP, fmt_s, priority_label, sjf_label
from servelab.reporting.queues import AGINGS_S, QueuePlan, longest_overtaken_s, queue_orders

# 600 flood requests at 20 req/s: ~30 s of overload on an engine that serves ~17 req/s.
SMALL = QueuePlan(flood_requests=600, priority_requests=600, sjf_requests=600,
                  swap_requests=40, swap_prompts=(512, 4096))


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    return queue_orders(tmp_path_factory.mktemp("queues"), workers=1, plan=SMALL)


def test_longest_overtaken_counts_only_later_arrivals_admitted_first():
    arrival_s = np.array([0.0, 1.0, 2.0, 3.0])
    # Request 0 is admitted last, at 9 s; requests 2 and 3 overtake it, the last at 6 s.
    first_scheduled_s = np.array([9.0, 1.5, 6.0, 4.0])
    assert longest_overtaken_s(arrival_s, first_scheduled_s) == pytest.approx(6.0)
    assert longest_overtaken_s(arrival_s, arrival_s + 1.0) == 0.0  # arrival order
    # Request 0 never admitted: left out; request 3 (admitted at 4 s) overtakes request 2.
    never = np.array([np.nan, 1.5, 6.0, 4.0])
    assert longest_overtaken_s(arrival_s, never) == pytest.approx(4.0 - 2.0)


def test_fair_queue_shields_the_light_tenant_from_the_flood(section):
    light = {q: section.data["tenants"][q]["tenants"]["light"] for q in ("fcfs", "fair")}
    assert light["fair"]["p99_ttft_ms"] <= 0.5 * light["fcfs"]["p99_ttft_ms"]
    assert light["fair"]["completed"] == light["fair"]["requests"] == SMALL.flood_requests // 10
    jain = {q: section.data["tenants"][q]["jain_fairness_index"] for q in ("fcfs", "fair")}
    assert jain["fcfs"] <= jain["fair"] <= 1.0


def test_priority_serves_the_high_class_first_and_aging_bounds_overtaking(section):
    runs = section.data["priorities"]
    high = {run: s["priorities"]["0"]["p99_ttft_ms"] for run, s in runs.items()}
    assert high[priority_label(AGINGS_S[0])] <= 0.5 * high["fcfs"]
    assert runs["fcfs"]["longest_overtaken_s"] == 0.0  # fcfs admits in arrival order
    for aging_s in AGINGS_S:
        assert 0.0 < runs[priority_label(aging_s)]["longest_overtaken_s"] <= aging_s
    for by_queue in section.data["sjf"].values():
        assert by_queue["fcfs"]["longest_overtaken_s"] == 0.0
        assert by_queue[sjf_label(0)]["longest_overtaken_s"] <= AGINGS_S[0]


def test_swap_keeps_every_victim_and_never_loses_to_recompute(section):
    for by_prompt in section.data["swap"].values():
        for runs in by_prompt.values():
            assert runs[SWAP]["preemptions"] > 0  # the pool is undersized
            assert runs[SWAP]["swapped_out"] == runs[SWAP]["preemptions"]
            assert runs[SWAP]["recomputed_tokens"] <= 0  # nothing computed twice
            assert runs[NO_CACHE]["recomputed_tokens"] > 0
            assert runs[SWAP]["mean_e2el_ms"] <= runs[NO_CACHE]["mean_e2el_ms"]
            assert all(r["completed"] == SMALL.swap_requests for r in runs.values())


def test_section_writes_its_charts_and_states_its_numbers(section):
    assert len(section.images) == 3
    for path in section.images:
        assert path.exists() and path.stat().st_size > 20_000
    light_fcfs = section.data["tenants"]["fcfs"]["tenants"]["light"]["p99_ttft_ms"]
    assert f"from {fmt_s(light_fcfs)}" in section.finding
    assert section.body.count("servelab simulate") == 4
    assert section.body.count("\n|---|---|") == 4  # the four tables
