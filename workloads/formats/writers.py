"""Write traces in our own schema (CSV, JSONL or Parquet), atomically."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from workloads.formats.files import atomic_output
from workloads.trace import Trace

SUFFIX_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}


def output_format(path: str | Path) -> str:
    """The format a path's suffix asks for (csv, jsonl or parquet)."""
    fmt = SUFFIX_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        known = ", ".join(SUFFIX_FORMATS)
        raise ValueError(f"{path}: cannot tell the output format; use a suffix among {known}")
    return fmt


def save_trace(trace: Trace, path: str | Path, fmt: str | None = None) -> None:
    """Write `trace` to `path` (format from the suffix unless given); nothing half-written."""
    fmt = fmt or output_format(path)
    if fmt not in WRITERS:
        raise ValueError(f"unknown output format {fmt!r} (known: {', '.join(WRITERS)})")
    with atomic_output(path) as temp:
        WRITERS[fmt](trace.table, temp)


def _write_csv(table: pd.DataFrame, path: Path) -> None:
    for column in ("prefix_hash_ids", "prefix_hash_tokens"):  # CSV cells: space-separated
        if column in table.columns:
            joined = [" ".join(map(str, ids)) for ids in table[column]]
            table = table.assign(**{column: joined})
    table.to_csv(path, index=False)  # floats are written with repr: they read back exactly


def _write_jsonl(table: pd.DataFrame, path: Path) -> None:
    # json.dumps writes floats with repr, so arrival_s round-trips bit for bit.
    with open(path, "w", encoding="utf-8") as file:
        for record in table.to_dict("records"):
            file.write(json.dumps(record) + "\n")


def _write_parquet(table: pd.DataFrame, path: Path) -> None:
    table.to_parquet(path, index=False)


WRITERS: dict[str, Callable[[pd.DataFrame, Path], None]] = {
    "csv": _write_csv,
    "jsonl": _write_jsonl,
    "parquet": _write_parquet,
}
