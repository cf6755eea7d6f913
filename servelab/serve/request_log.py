"""A durable SQLite log of every request, written by its own thread so nothing waits on disk.

A request queued for the engine is inserted when it arrives (finish_reason 'unfinished') and
its row is completed when it ends; one refused at the door gets one complete row. Producers
(the engine thread, the HTTP handlers) only put rows on a queue. The writer takes whatever has
queued up, applies it in one transaction and commits (group commit: one row when traffic is
light, a batch under load, never a timer), so an arrival is on disk one commit after it was
queued. WAL mode with synchronous=NORMAL makes a commit survive the server process being
killed (SIGKILL): the requests in flight at a kill stay in the log, unfinished; a power loss
may lose the last commits. Each row can carry a callback run once its commit is done, so a
response can wait until its row is on disk. The schema lives in workloads.formats.sqlite,
which reads logs back.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import astuple, dataclass
from pathlib import Path

from sim.engine.core import FinishReason, Request
from workloads.formats.sqlite import COLUMNS, TABLE, UNFINISHED, create_schema

log = logging.getLogger(__name__)
MAX_BATCH_ROWS = 512  # rows per transaction at most
_STOP = object()


@dataclass(frozen=True, slots=True)
class LogRow:
    """One request as the log stores it; fields in workloads.formats.sqlite.COLUMNS order."""

    request_id: str
    server_start_unix: float
    arrival_s: float
    arrival_unix: float
    prompt_len: int
    max_tokens: int
    output_len: int
    tenant: str | None
    ttft_s: float | None
    finish_s: float | None
    finish_reason: str
    http_status: int


# What the writer's queue holds besides _STOP: a row, whether it is an arrival (insert and
# remember its id) or a final row (complete the arrival, or insert), and the callback.
_Item = tuple[LogRow, bool, Callable[[], None] | None]
# The columns a final row sets on its arrival's row: everything an arrival cannot know.
_FINISH_COLUMNS = ("output_len", "ttft_s", "finish_s", "finish_reason", "http_status")

# The HTTP status each finish reason answers with (a failed stream already sent its 200).
_STATUS = {FinishReason.REJECTED: 400, FinishReason.FAILED: 500}


def row_of(request: Request, start_unix: float, tenant: str | None,
           refused: str | None = None, http_status: int = 200) -> LogRow:
    """The log row of a finished request, or of one `refused` ('overloaded', ...) at the door."""
    times = request.token_times_s
    reason = refused or (request.finish_reason.value if request.finish_reason else "unknown")
    if refused is None and request.finish_reason in _STATUS:
        http_status = _STATUS[request.finish_reason]
    return LogRow(
        request_id=request.request_id, server_start_unix=start_unix,
        arrival_s=request.arrival_s, arrival_unix=start_unix + request.arrival_s,
        prompt_len=request.prompt_len, max_tokens=request.max_new_tokens,
        output_len=len(times), tenant=tenant,
        ttft_s=times[0] - request.arrival_s if times else None,
        finish_s=request.finish_s, finish_reason=reason, http_status=http_status,
    )


def arrival_row_of(request: Request, start_unix: float, tenant: str | None) -> LogRow:
    """The row of a request just queued: arrival and lengths known, nothing of its end."""
    return LogRow(
        request_id=request.request_id, server_start_unix=start_unix,
        arrival_s=request.arrival_s, arrival_unix=start_unix + request.arrival_s,
        prompt_len=request.prompt_len, max_tokens=request.max_new_tokens, output_len=0,
        tenant=tenant, ttft_s=None, finish_s=None, finish_reason=UNFINISHED, http_status=0,
    )


class RequestLog:
    """Appends LogRows to a SQLite file from a writer thread fed by a queue."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:  # opened here so a bad path fails at startup, then used by the writer only
            self._db = sqlite3.connect(self.path, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            create_schema(self._db)
        except sqlite3.Error as exc:
            raise ValueError(f"request log {self.path}: cannot open ({exc})") from None
        names = ", ".join(name for name, _ in COLUMNS)
        marks = ", ".join("?" for _ in COLUMNS)
        self._insert = f"INSERT INTO {TABLE} ({names}) VALUES ({marks})"
        sets = ", ".join(f"{name} = ?" for name in _FINISH_COLUMNS)
        self._complete = f"UPDATE {TABLE} SET {sets} WHERE id = ?"
        self._open: dict[str, int] = {}  # writer only: request_id -> id of its arrival's row
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)
        self._thread.start()

    def write_arrival(self, row: LogRow) -> None:
        """Queue the row of a request that just arrived (never blocks); `write` completes it."""
        self._queue.put((row, True, None))

    def write(self, row: LogRow, on_durable: Callable[[], None] | None = None) -> None:
        """Queue a request's final row (never blocks): it completes the row its arrival wrote,
        or is appended if none was; `on_durable` runs on the writer once it is committed."""
        self._queue.put((row, False, on_durable))

    def close(self, timeout_s: float = 10.0) -> None:
        """Write everything queued, then stop the writer and close the file."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout_s)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH_ROWS:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if _STOP in batch:
                stopping = True
                batch = [item for item in batch if item is not _STOP]
            self._commit(batch)
        self._db.close()

    def _commit(self, batch: list[_Item]) -> None:
        opened: list[str] = []  # arrivals inserted by this batch
        if batch:
            try:
                with self._db:  # one transaction, committed on exit
                    for row, arrival, _ in batch:
                        self._apply(row, arrival, opened)
            except sqlite3.Error:
                log.exception("request log %s: lost %d rows", self.path, len(batch))
                # Rolled back: those ids may be handed out again, so never update them.
                for request_id in opened:
                    self._open.pop(request_id, None)
        for _, _, on_durable in batch:
            if on_durable is not None:
                on_durable()  # also after a failure: a response must not wait forever

    def _apply(self, row: LogRow, arrival: bool, opened: list[str]) -> None:
        row_id = None if arrival else self._open.pop(row.request_id, None)
        if row_id is None:
            cursor = self._db.execute(self._insert, astuple(row))
            if arrival:
                self._open[row.request_id] = cursor.lastrowid
                opened.append(row.request_id)
        else:
            finish = tuple(getattr(row, name) for name in _FINISH_COLUMNS)
            self._db.execute(self._complete, (*finish, row_id))
