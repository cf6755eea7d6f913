"""`validate`'s measured runs on the executor send a session's turn think time after the
previous answer ended (sim.cluster.closed_loop), as the simulation of them does."""

from __future__ import annotations

import pytest

from executor.calibration.validation import measure_runs
from sim.engine.scheduler_config import SchedulerConfig
from workloads import open_trace

CHAT = ("synthetic:users=2,rate=4,turns=fixed(3),think=fixed(0.25),question=fixed(12),"
        "output=fixed(4)")


@pytest.mark.parametrize("open_loop", [False, True])
def test_measured_turns_follow_the_previous_answer(tiny_model, open_loop):
    trace = open_trace(CHAT)
    config = SchedulerConfig("continuous", num_blocks=64, max_model_len=256)
    run = measure_runs(trace, {"continuous": config}, tiny_model,
                       open_loop=open_loop)["continuous"][0]
    written = dict(zip(trace.request_ids, trace.arrival_s.tolist(), strict=True))
    table = trace.table
    sessions: dict[str, list] = {}
    for session, think_s, request in zip(table["session_id"], table["think_s"], run.requests,
                                         strict=True):
        sessions.setdefault(session, []).append((float(think_s), request))
    for rows in sessions.values():
        for (_, before), (think_s, after) in zip(rows, rows[1:], strict=False):
            assert before.is_finished and after.is_finished
            sent_s = written[after.request_id] if open_loop else before.finish_s + think_s
            assert after.arrival_s == sent_s
