"""`validate` simulates a session spec closed-loop, as its measured runs (the executor's, or a
live server's through the load client) send it: a turn think time after the previous
answer ended, unless open_loop."""

from __future__ import annotations

import pytest

from executor.calibration.validation import compare
from sim.cluster.closed_loop import replay
from sim.cost.calibrated import FEATURES, CalibratedCostModel
from sim.cost.fixed_backend import ConstantBackend
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.workload import requests_from_trace
from workloads import open_trace

CHAT = ("synthetic:users=3,rate=2,turns=fixed(3),think=fixed(0.5),question=fixed(32),"
        "output=fixed(8)")
STEP_S = 0.01  # the calibration's constant term: every step costs 10 ms


def turns(trace, requests) -> dict[str, list]:
    """Each session's requests in turn order, with their think times."""
    table = trace.table
    out: dict[str, list] = {}
    for session, think_s, request in zip(table["session_id"], table["think_s"], requests,
                                         strict=True):
        out.setdefault(session, []).append((float(think_s), request))
    return out


@pytest.mark.parametrize("open_loop", [False, True])
def test_validate_simulates_each_turn_after_the_previous_answer(open_loop):
    trace = open_trace(CHAT)
    config = SchedulerConfig("continuous", num_blocks=256)
    # The measured side: any run of the trace (here one on a constant-time backend).
    measured = replay(trace, requests_from_trace(trace),
                      Engine(Scheduler(config), ConstantBackend(step_s=STEP_S)))
    model = CalibratedCostModel((STEP_S,) + (0.0,) * (len(FEATURES) - 1))
    results, pairs = compare(trace, {"continuous": config}, {"continuous": [measured]}, model,
                             open_loop=open_loop)
    simulated = pairs["continuous"][1]
    written = dict(zip(trace.request_ids, trace.arrival_s.tolist(), strict=True))
    for rows in turns(trace, simulated.requests).values():
        for (_, before), (think_s, after) in zip(rows, rows[1:], strict=False):
            sent_s = written[after.request_id] if open_loop else before.finish_s + think_s
            assert after.arrival_s == sent_s
            # Written times assume instant answers: the closed loop sends later.
            assert (after.arrival_s > written[after.request_id]) != open_loop
    if not open_loop:  # the same closed loop at the same step cost: nothing differs
        assert all(e == pytest.approx(0.0, abs=1e-9)
                   for e in results["continuous"]["error"].values() if e is not None)
