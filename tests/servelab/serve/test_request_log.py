"""The SQLite request log: rows, arrivals completed by their finish, group commits, reading
it back as a trace."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from servelab.serve.request_log import LogRow, RequestLog, arrival_row_of
from sim.engine.core import Request
from workloads import TraceError, detect_format, load_trace


def row(i: int, reason: str = "length", output_len: int = 5, tenant: str | None = "a",
        arrival_s: float | None = None) -> LogRow:
    arrival = 0.5 * i if arrival_s is None else arrival_s
    return LogRow(f"cmpl-{i}", 1000.0, arrival, 1000.0 + arrival, 10 + i, 20, output_len,
                  tenant, 0.01, arrival + 0.2, reason, 200)


def test_rows_commit_call_back_and_append_across_restarts(tmp_path):
    path = tmp_path / "log.sqlite"
    log = RequestLog(path)
    durable = threading.Event()
    log.write(row(0), durable.set)
    assert durable.wait(30.0)  # a hang guard: the commit thread is not timed
    with sqlite3.connect(path) as reader:  # committed: visible to another connection now
        assert reader.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 1
    log.close()
    log = RequestLog(path)  # a restarted server appends
    for i in range(1, 4):
        log.write(row(i))
    log.close()
    with sqlite3.connect(path) as reader:
        ids = [r[0] for r in reader.execute("SELECT request_id FROM requests ORDER BY id")]
    assert ids == ["cmpl-0", "cmpl-1", "cmpl-2", "cmpl-3"]


def test_arrival_row_is_committed_at_once_and_completed_by_the_final_row(tmp_path):
    path = tmp_path / "log.sqlite"
    log = RequestLog(path)
    for i in range(3):
        log.write_arrival(arrival_row_of(Request(f"cmpl-{i}", 0.5 * i, 10 + i, 20), 1000.0, "a"))
    durable = threading.Event()
    log.write(row(1), durable.set)  # the arrivals were queued first: committed by now
    assert durable.wait(30.0)  # a hang guard: the commit thread is not timed
    with sqlite3.connect(path) as reader:  # before close: what a kill -9 now would leave
        rows = reader.execute("SELECT request_id, output_len, finish_s, finish_reason, "
                              "http_status FROM requests ORDER BY id").fetchall()
    assert rows == [("cmpl-0", 0, None, "unfinished", 0), ("cmpl-1", 5, 0.7, "length", 200),
                    ("cmpl-2", 0, None, "unfinished", 0)]
    log.close()
    trace = load_trace(path)  # unfinished rows replay the max_tokens asked for
    assert trace.request_ids == ["cmpl-0", "cmpl-1", "cmpl-2"]
    assert trace.prompt_len.tolist() == [10, 11, 12]
    assert trace.output_len.tolist() == [20, 5, 20]


def test_log_loads_as_a_trace_replay_lengths_and_tenants(tmp_path):
    path = tmp_path / "seen.sqlite"
    log = RequestLog(path)
    log.write(row(2, arrival_s=3.0))  # written out of arrival order: sorted on read
    log.write(row(0, reason="stop", output_len=3, tenant=None, arrival_s=1.0))
    log.write(row(1, reason="aborted", output_len=2, arrival_s=2.0))
    log.write(row(3, reason="overloaded", output_len=0, tenant="b", arrival_s=2.5))
    log.close()
    assert detect_format(path) == "sqlite"
    trace = load_trace(path)
    assert trace.request_ids == ["cmpl-0", "cmpl-1", "cmpl-3", "cmpl-2"]
    assert trace.arrival_s.tolist() == [0.0, 1.0, 1.5, 2.0]
    assert trace.prompt_len.tolist() == [10, 11, 13, 12]
    # Natural finishes replay what was generated; cut-short ones what was asked for.
    assert trace.output_len.tolist() == [3, 20, 20, 5]
    assert trace.table["tenant"].tolist() == ["default", "a", "b", "a"]


def test_sqlite_file_that_is_not_a_request_log_is_a_clear_error(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x INTEGER)")
    with pytest.raises(TraceError, match="not a servelab request log"):
        load_trace(path)
    empty = tmp_path / "empty.sqlite"
    RequestLog(empty).close()
    with pytest.raises(TraceError, match="no requests"):
        load_trace(empty)
