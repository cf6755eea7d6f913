"""The server's SQLite request log: its schema, and reading it back as a trace.

`servelab serve --request-log F.sqlite` appends one row per request, written when the request
arrives and completed when it ends; `servelab trace F.sqlite` replays what the server saw. A
row's output_len for replay is the tokens the server generated when the request ended
naturally (length or stop): that is the demand the simulator must reproduce, since it runs
every request to its trace length with EOS ignored. A request cut short (aborted, failed,
refused with 503 or rejected) never showed its natural length, so its replay length is the
max_tokens the client asked for. So is an unfinished row's (still in flight, or in flight
when the server was killed): the log does not record tokens as they are produced, and the
count so far would only be a lower bound on the demand.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from workloads.validate import TraceError, Where, as_float, as_int, as_str, check_table

SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
SCHEMA_VERSION = 1  # PRAGMA user_version of a request log
TABLE = "requests"
# (column, SQL type) in insert order; `id` (an autoincrement key) comes first in the table.
COLUMNS = (
    ("request_id", "TEXT NOT NULL"),  # the server's id, e.g. cmpl-18f0c2a1b3e-7
    ("server_start_unix", "REAL NOT NULL"),  # wall clock when this server process started
    ("arrival_s", "REAL NOT NULL"),  # seconds since server start (monotonic clock)
    ("arrival_unix", "REAL NOT NULL"),  # server_start_unix + arrival_s: orders rows across restarts
    ("prompt_len", "INTEGER NOT NULL"),  # prompt tokens
    ("max_tokens", "INTEGER NOT NULL"),  # what the client asked for
    ("output_len", "INTEGER NOT NULL"),  # tokens generated (0 if refused, or unfinished)
    ("tenant", "TEXT"),  # X-Tenant header, else the body's `user`, else NULL
    ("ttft_s", "REAL"),  # first token - arrival; NULL without a token, or unfinished
    ("finish_s", "REAL"),  # seconds since server start when it ended; NULL if unfinished
    # length|stop|aborted|failed|rejected|overloaded|draining, or unfinished until it ends
    ("finish_reason", "TEXT NOT NULL"),
    ("http_status", "INTEGER NOT NULL"),  # the status the client got; 0 if unfinished
)
NATURAL_FINISH = ("length", "stop")
UNFINISHED = "unfinished"  # finish_reason of a row whose request has not ended (or never will)
DEFAULT_TENANT = "default"  # the replay tenant of rows that named none


def create_schema(connection: sqlite3.Connection) -> None:
    """Create the log table if missing; raise if the file holds another schema version."""
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
    if TABLE in tables and version != SCHEMA_VERSION:
        raise ValueError(f"request log schema version {version}, expected {SCHEMA_VERSION}")
    columns = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)
    connection.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} "
                       f"(id INTEGER PRIMARY KEY AUTOINCREMENT, {columns})")
    connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    connection.commit()


def read_request_log(path: Path) -> pd.DataFrame:
    """A request log as a trace table, in arrival order, arrival_s re-zeroed."""
    source = str(path)
    try:
        connection = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise TraceError(source, f"not a readable SQLite file ({exc})") from None
    try:
        rows = _select(connection, source)
    finally:
        connection.close()
    if not rows:
        raise TraceError(source, "no requests in the log")
    ids, arrival, prompt, max_tokens, output, tenant, reason = zip(*rows, strict=True)
    # Only natural finishes replay what was generated; everything else, unfinished rows
    # included, the max_tokens asked for (module docstring).
    natural = np.isin(np.asarray(reason, dtype=object), NATURAL_FINISH)
    where = Where(source, unit="row")
    replay_len = np.where(natural, as_int(output, "output_len", where),
                          as_int(max_tokens, "output_len", where))
    arrival_s = as_float(arrival, "arrival_s", where)
    table = pd.DataFrame({
        "arrival_s": arrival_s - arrival_s[0],
        "prompt_len": as_int(prompt, "prompt_len", where),
        "output_len": replay_len.astype(np.int64),
        "request_id": as_str(ids, "request_id", where),
    })
    if any(t is not None for t in tenant):
        filled = [DEFAULT_TENANT if t is None else t for t in tenant]
        table["tenant"] = as_str(filled, "tenant", where)
    check_table(table, where)
    return table


def _select(connection: sqlite3.Connection, source: str) -> list[tuple]:
    try:
        return connection.execute(
            f"SELECT request_id, arrival_unix, prompt_len, max_tokens, output_len, tenant, "
            f"finish_reason FROM {TABLE} ORDER BY arrival_unix, id"
        ).fetchall()
    except sqlite3.DatabaseError as exc:  # no such table / column, or not a database
        raise TraceError(source, f"not a servelab request log ({exc})") from None
