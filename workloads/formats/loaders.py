"""Trace loaders: Azure LLM inference CSV, Mooncake JSONL, vLLM request records and our own
CSV/JSONL/Parquet.

The format is detected from the file's content (header or first record), not its name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from workloads.formats.files import read_csv_rows, read_first_line, read_json_lines, require_columns
from workloads.formats.sharegpt import read_sharegpt
from workloads.formats.sqlite import SQLITE_MAGIC, read_request_log
from workloads.trace import Trace
from workloads.validate import (
    OPTIONAL_COLUMNS,
    TraceError,
    Where,
    as_float,
    as_hash_lists,
    as_int,
    as_str,
    check_table,
)

AZURE_FIELDS = {
    "arrival_s": "TIMESTAMP",
    "prompt_len": "ContextTokens",
    "output_len": "GeneratedTokens",
}
MOONCAKE_FIELDS = {
    "arrival_s": "timestamp",
    "prompt_len": "input_length",
    "output_len": "output_length",
    "prefix_hash_ids": "hash_ids",
}
# Per-request records of a vLLM run (LLMServingSim's bench format): arrival_time in epoch
# seconds, token counts, and the engine's own timestamps (ignored: the replay makes its own).
VLLM_REQUEST_FIELDS = {
    "arrival_s": "arrival_time",
    "prompt_len": "input_toks",
    "output_len": "output_toks",
}
OWN_REQUIRED = ("arrival_s", "prompt_len", "output_len")
# Azure wall-clock stamps: up to 9 fractional digits (the files have 7, beyond datetime's 6).
_AZURE_STAMP = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,9})?"


def load_trace(path: str | Path, fmt: str | None = None, name: str | None = None) -> Trace:
    """Read a trace file; `fmt` (one of FORMATS) overrides detection from the content."""
    path = Path(path)
    fmt = fmt or detect_format(path)
    if fmt not in READERS:
        raise ValueError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    return Trace(name or path.name, READERS[fmt](path))


def detect_format(path: str | Path) -> str:
    """The format of a trace file, from its first bytes: Parquet magic, JSON keys or CSV header."""
    path = Path(path)
    first = read_first_line(path).lstrip(b"\xef\xbb\xbf")
    if first.startswith(b"PAR1"):
        return "parquet"
    if first.startswith(SQLITE_MAGIC):
        return "sqlite"
    text = first.decode("utf-8", errors="replace").strip()
    if not text:
        raise TraceError(str(path), "file is empty", line=1)
    if text.startswith("["):
        return "sharegpt"
    if text.startswith("{"):
        if '"input_length"' in text:
            return "mooncake"
        if '"input_toks"' in text:
            return "vllm-requests"
        if '"arrival_s"' in text:
            return "jsonl"
    else:
        header = [cell.strip() for cell in text.split(",")]
        if set(AZURE_FIELDS.values()) <= set(header):
            return "azure"
        if "arrival_s" in header:
            return "csv"
    raise TraceError(
        str(path),
        f"unrecognised trace format (first line {text[:80]!r}); "
        f"give the format explicitly, one of {', '.join(FORMATS)}",
        line=1,
    )


def read_azure_csv(path: Path) -> pd.DataFrame:
    """Azure LLM inference CSV: TIMESTAMP (wall clock), ContextTokens, GeneratedTokens."""
    rows, lines = read_csv_rows(path, text_columns=("TIMESTAMP",))
    require_columns(rows.columns, tuple(AZURE_FIELDS.values()), str(path))
    where = Where(str(path), lines, fields=AZURE_FIELDS)
    table = pd.DataFrame(
        {
            "arrival_s": _azure_arrival_s(rows["TIMESTAMP"], where),
            "prompt_len": as_int(rows["ContextTokens"], "prompt_len", where),
            "output_len": as_int(rows["GeneratedTokens"], "output_len", where),
            "request_id": pd.Series(np.arange(len(rows)).astype(str), dtype=str),
        }
    )
    check_table(table, where)
    return table


def _azure_arrival_s(stamps: pd.Series, where: Where) -> np.ndarray:
    """Seconds since the first stamp; the fraction is read as integer nanoseconds, exactly."""
    whole = pd.to_datetime(stamps.str.slice(0, 19), format="%Y-%m-%d %H:%M:%S", errors="coerce")
    ok = stamps.str.fullmatch(_AZURE_STAMP).fillna(False).to_numpy(bool) & whole.notna().to_numpy()
    if not ok.all():
        row = int(np.argmin(ok))
        problem = f"expected 'YYYY-MM-DD HH:MM:SS.fffffff', got {stamps.iloc[row]!r}"
        raise where.error(row, problem, "arrival_s")
    fraction_ns = stamps.str.slice(20).str.ljust(9, "0").astype(np.int64).to_numpy()
    stamp_ns = whole.to_numpy().astype("datetime64[ns]").astype(np.int64) + fraction_ns
    return (stamp_ns - stamp_ns[0]) / 1e9


def read_mooncake_jsonl(path: Path) -> pd.DataFrame:
    """Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (512-token blocks)."""
    required = ("timestamp", "input_length", "output_length")
    records, lines = read_json_lines(path, required)
    where = Where(str(path), lines, fields=MOONCAKE_FIELDS)
    table = pd.DataFrame(
        {
            "arrival_s": _from_zero(
                as_float([r["timestamp"] for r in records], "arrival_s", where) / 1000.0
            ),
            "prompt_len": as_int([r["input_length"] for r in records], "prompt_len", where),
            "output_len": as_int([r["output_length"] for r in records], "output_len", where),
            "request_id": pd.Series(np.arange(len(records)).astype(str), dtype=str),
        }
    )
    if any("hash_ids" in record for record in records):
        hashes = as_hash_lists([r.get("hash_ids") for r in records], "prefix_hash_ids", where)
        table["prefix_hash_ids"] = pd.Series(hashes, dtype=object)
    check_table(table, where)
    return table


def read_vllm_requests(path: Path) -> pd.DataFrame:
    """vLLM request records: request_id, input_toks, output_toks, arrival_time (epoch s)."""
    required = tuple(VLLM_REQUEST_FIELDS.values())
    records, lines = read_json_lines(path, required)
    where = Where(str(path), lines, fields=VLLM_REQUEST_FIELDS)
    ids = [str(r.get("request_id", k)) for k, r in enumerate(records)]
    table = pd.DataFrame(
        {
            "arrival_s": _from_zero(
                as_float([r["arrival_time"] for r in records], "arrival_s", where)),
            "prompt_len": as_int([r["input_toks"] for r in records], "prompt_len", where),
            "output_len": as_int([r["output_toks"] for r in records], "output_len", where),
            "request_id": pd.Series(ids, dtype=str),
        }
    )
    check_table(table, where)
    return table


def read_own_csv(path: Path) -> pd.DataFrame:
    """Our schema as CSV; prefix_hash_ids hold space-separated block ids."""
    rows, lines = read_csv_rows(path)
    require_columns(rows.columns, OWN_REQUIRED, str(path))

    def column(key: str) -> pd.Series:
        return rows[key].str.split() if key in _LIST_COLUMNS else rows[key]

    return _own_table(rows.columns, column, Where(str(path), lines))


def read_own_jsonl(path: Path) -> pd.DataFrame:
    """Our schema as JSON lines, one object per request."""
    records, lines = read_json_lines(path, OWN_REQUIRED)
    present = {key for record in records for key in record}
    return _own_table(present, lambda key: [r.get(key) for r in records], Where(str(path), lines))


def read_own_parquet(path: Path) -> pd.DataFrame:
    """Our schema as Parquet; errors name 1-based rows."""
    try:
        rows = pd.read_parquet(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise TraceError(str(path), f"not a readable Parquet file ({exc})") from None
    require_columns(rows.columns, OWN_REQUIRED, str(path))
    if len(rows) == 0:
        raise TraceError(str(path), "no requests")
    return _own_table(rows.columns, rows.__getitem__, Where(str(path), unit="row"))


def _own_table(
    present: Sequence[str] | set[str], column: Callable[[str], Sequence], where: Where
) -> pd.DataFrame:
    """Convert our columns (extra ones are ignored); arrival times are shifted to start at 0."""
    count = len(column("arrival_s"))
    ids = column("request_id") if "request_id" in present else np.arange(count).astype(str)
    table = pd.DataFrame(
        {
            "arrival_s": _from_zero(as_float(column("arrival_s"), "arrival_s", where)),
            "prompt_len": as_int(column("prompt_len"), "prompt_len", where),
            "output_len": as_int(column("output_len"), "output_len", where),
            "request_id": as_str(ids, "request_id", where),
        }
    )
    for key in OPTIONAL_COLUMNS:
        if key in present:
            table[key] = _OPTIONAL_CONVERTERS[key](column(key), key, where)
    check_table(table, where)
    return table


def _from_zero(arrival_s: np.ndarray) -> np.ndarray:
    return arrival_s - arrival_s[0]


def _as_list_column(values: Sequence, key: str, where: Where) -> pd.Series:
    return pd.Series(as_hash_lists(values, key, where), dtype=object)


_LIST_COLUMNS = ("prefix_hash_ids", "prefix_hash_tokens")
_OPTIONAL_CONVERTERS = {
    "tenant": as_str,
    "priority": as_int,
    "prefix_hash_ids": _as_list_column,
    "prefix_hash_tokens": _as_list_column,
    "session_id": as_str,
    "turn": as_int,
    "think_s": as_float,
}

READERS: dict[str, Callable[[Path], pd.DataFrame]] = {
    "azure": read_azure_csv,
    "mooncake": read_mooncake_jsonl,
    "vllm-requests": read_vllm_requests,
    "csv": read_own_csv,
    "jsonl": read_own_jsonl,
    "parquet": read_own_parquet,
    "sqlite": read_request_log,
    "sharegpt": read_sharegpt,
}
FORMATS = tuple(READERS)
