"""File plumbing for traces: CSV and JSON-lines rows with their line numbers, atomic writes."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from workloads.validate import TraceError


def read_first_line(path: Path, limit_bytes: int = 1 << 20) -> bytes:
    """The first non-blank line of a file (at most `limit_bytes`; b"" if none), for detection."""
    with open(path, "rb") as file:
        for line in iter(lambda: file.readline(limit_bytes), b""):
            if line.strip():
                return line
    return b""


def read_csv_rows(
    path: Path, text_columns: tuple[str, ...] | None = None
) -> tuple[pd.DataFrame, np.ndarray]:
    """Rows and the file line of each; blank lines skipped.

    `text_columns` are read as strings, the others parsed by pandas (ints exactly, and fast);
    None reads every column as strings. An empty cell is "", so errors can say so.
    """
    source = str(path)
    try:
        table = pd.read_csv(
            path,
            dtype=str if text_columns is None else dict.fromkeys(text_columns, str),
            keep_default_na=False,  # "" stays "" (a numeric column then stays text)
            skip_blank_lines=False,  # keep blank lines as rows so row i sits on line i + 2
            skipinitialspace=True,
            encoding="utf-8-sig",
        )
    except pd.errors.EmptyDataError:
        raise TraceError(source, "file is empty", line=1) from None
    except pd.errors.ParserError as exc:
        found = re.search(r"line (\d+)", str(exc))
        line = int(found.group(1)) if found else None
        problem = f"malformed CSV ({str(exc).split('error: ')[-1].strip()})"
        raise TraceError(source, problem, line=line) from None
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    lines = np.arange(len(table)) + 2  # line 1 is the header
    # A blank line turns every column into text, so only an all-text table can hold one.
    if not any(pd.api.types.is_numeric_dtype(dtype) for dtype in table.dtypes):
        blank = (table == "").all(axis=1).to_numpy()
        table, lines = table[~blank].reset_index(drop=True), lines[~blank]
    if len(table) == 0:
        raise TraceError(source, "no requests after the header", line=2)
    return table, lines


def _not_utf8(path: Path) -> TraceError:
    """The error for a file that is not UTF-8, naming the line of the first bad byte."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return TraceError(str(path), "not UTF-8 text", line=line)
    return TraceError(str(path), "not UTF-8 text")


def require_columns(columns: pd.Index, required: tuple[str, ...], source: str) -> None:
    """Raise naming the header line and the first missing column."""
    for name in required:
        if name not in columns:
            raise TraceError(
                source, f"missing column (header has {list(columns)})", line=1, field=name
            )


def read_json_lines(path: Path, required: tuple[str, ...]) -> tuple[list[dict], np.ndarray]:
    """One JSON object per non-blank line, each with the `required` keys, and its line number."""
    source, records, lines = str(path), [], []
    with open(path, "rb") as file:  # bytes: a decoding error then knows its line
        for number, raw in enumerate(file, start=1):
            if not raw.strip():
                continue
            record = _parse_json_object(raw, source, number)
            for key in required:
                if key not in record:
                    raise TraceError(source, "missing key", line=number, field=key)
            records.append(record)
            lines.append(number)
    if not records:
        raise TraceError(source, "file is empty", line=1)
    return records, np.asarray(lines)


def _parse_json_object(raw: bytes, source: str, line: int) -> dict:
    try:
        record = json.loads(raw.decode("utf-8-sig" if line == 1 else "utf-8"))
    except UnicodeDecodeError as exc:
        raise TraceError(source, f"not UTF-8 text (byte {exc.start + 1})", line=line) from None
    except json.JSONDecodeError as exc:
        raise TraceError(
            source, f"malformed JSON ({exc.msg}, column {exc.colno})", line=line
        ) from None
    if not isinstance(record, dict):
        raise TraceError(source, f"expected a JSON object, got {type(record).__name__}", line=line)
    return record


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; it replaces `path` only if the block succeeds."""
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path}: directory {path.parent} does not exist")
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    temp = Path(temp_name)
    try:
        yield temp
        os.chmod(temp, 0o644)  # mkstemp makes 0600 files; outputs are ordinary files
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
