"""The step log gives back exactly the records it was given, as records, a table and columns."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest

from sim.cluster.config import ClusterConfig
from sim.cluster.router import RouterConfig
from sim.cluster.run import run_cluster
from sim.cost.roofline import AnalyticCostModel
from sim.engine.core import Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.engine.step_log import FIELDS, StepLog, StepRecord, pack, step_array
from sim.replay.metrics import step_table, summarize

RECORDS = [StepRecord(0.1 * i + 1e-9, 0.0213 + i / 7, i, 3 * i, 2 * i, i, 0, 2**40 + i, 5, 7, i % 2)
           for i in range(6)]


def test_records_come_back_exactly_as_records():
    log = StepLog(RECORDS)
    assert len(log) == 6 and bool(log) and not StepLog()
    assert list(log) == RECORDS and log == RECORDS and log == StepLog(RECORDS)
    assert log[0] == RECORDS[0] and log[-1] == RECORDS[-1] and log[1:4] == RECORDS[1:4]
    assert all(type(value) is int for value in log[2][2:])  # the counts stay integers
    assert log[3].kv_blocks_used == 2**40 + 3
    with pytest.raises(IndexError):
        log[6]


def test_the_engine_adds_fields_and_concat_keeps_order():
    log = StepLog()
    for record in RECORDS[:2]:
        log.add(tuple(record))
    other = StepLog(RECORDS[2:])
    assert StepLog.concat([log, other]) == RECORDS
    log.clear()
    assert len(log) == 0 and log == []


def test_a_record_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="11 fields"):
        StepLog([(1.0, 2.0)])


def test_table_and_columns_hold_the_same_numbers():
    log = StepLog(RECORDS)
    table = log.table()
    assert table.shape == (6, len(FIELDS))
    assert np.array_equal(table, np.array(RECORDS, dtype=float))
    assert np.array_equal(step_array(RECORDS), table)
    assert list(log.column("duration_s")) == [r.duration_s for r in RECORDS]
    log.add(tuple(RECORDS[0]))  # (the table is a copy: the log still grows)
    assert len(log) == 7


def test_step_table_matches_records_read_one_by_one():
    expected = pd.DataFrame.from_records(RECORDS, columns=list(FIELDS))
    pd.testing.assert_frame_equal(step_table(StepLog(RECORDS)), expected)
    pd.testing.assert_frame_equal(step_table(RECORDS), expected)


def test_a_cluster_run_summarises_as_from_the_records():
    """The pooled log of a cluster replay holds every engine's steps, engine by engine, and the
    summary reads the same numbers as from the records themselves."""
    backend = AnalyticCostModel.preset("llama-3-8b", "h100")
    config = SchedulerConfig(policy="chunked", num_blocks=400)
    engines = [Engine(Scheduler(config), backend) for _ in range(3)]
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(1 / 30, 120))
    requests = [Request(f"r{i}", float(t), int(rng.integers(20, 700)), int(rng.integers(1, 90)))
                for i, t in enumerate(arrivals)]
    result = run_cluster(requests, engines, ClusterConfig(
        num_replicas=3, router=RouterConfig("least-requests"))).run_result()
    records = [record for engine in engines for record in engine.steps]
    assert list(result.steps) == records and len(records) > 100
    from_records = type(result)(result.requests, records, result.num_preemptions,
                                result.num_blocks, result.max_num_seqs)
    assert summarize(result) == summarize(from_records)


def test_a_log_sent_between_processes_keeps_growing_its_own_buffer():
    """Sweep and plan workers return logs by pickle: the copy's add_packed must write into the
    copy, not into a buffer nobody reads."""
    copy = pickle.loads(pickle.dumps(StepLog(RECORDS[:2])))
    copy.add_packed(pack(*RECORDS[2]))
    assert copy == RECORDS[:3]
