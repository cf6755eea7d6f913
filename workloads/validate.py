"""Trace validation shared by every loader and by `Trace` itself.

Errors name the source, the line (or row) and the field: `conv.csv: line 7: ContextTokens: ...`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

REQUIRED_COLUMNS = ("arrival_s", "prompt_len", "output_len", "request_id")
# prefix_hash_tokens: tokens each prefix hash id covers (token-granular prefixes); without
# it every id covers PREFIX_BLOCK_TOKENS. session_id, turn and think_s place a row in a
# conversation (or a closed-loop user) so a closed-loop driver can release it.
OPTIONAL_COLUMNS = (
    "tenant", "priority", "prefix_hash_ids", "prefix_hash_tokens", "session_id", "turn", "think_s"
)
COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS


class TraceError(ValueError):
    """An invalid trace; the message names the source, the line (or row) and the field."""

    def __init__(
        self,
        source: str,
        problem: str,
        *,
        line: int | None = None,
        field: str | None = None,
        unit: str = "line",
    ) -> None:
        place = [source] + ([f"{unit} {line}"] if line is not None else [])
        super().__init__(": ".join([*place, *([field] if field else []), problem]))
        self.source = source
        self.line = line
        self.field = field


@dataclass(frozen=True)
class Where:
    """Maps row positions back to what a user can find: file lines or 1-based table rows."""

    source: str
    lines: np.ndarray | None = None  # file line of each row; None counts rows from 1
    unit: str = "line"
    fields: Mapping[str, str] = field(default_factory=dict)  # our column -> the file's name

    def error(self, row: int | None, problem: str, column: str | None = None) -> TraceError:
        """A TraceError at `row` (a 0-based position in the table) about `column`."""
        line = None
        if row is not None:
            line = int(self.lines[row]) if self.lines is not None else row + 1
        name = self.fields.get(column, column) if column else None
        return TraceError(self.source, problem, line=line, field=name, unit=self.unit)


def _is_missing(value: object) -> bool:
    if value is None or (isinstance(value, str) and not value.strip()):
        return True
    return isinstance(value, float) and np.isnan(value)


def _bad_value(values: pd.Series, row: int, expected: str) -> str:
    value = values.iloc[row]
    value = value.item() if isinstance(value, np.generic) else value  # 12.5, not np.float64(12.5)
    return "missing value" if _is_missing(value) else f"expected {expected}, got {value!r}"


def _as_series(values: Sequence | pd.Series) -> pd.Series:
    if isinstance(values, pd.Series):
        return values.reset_index(drop=True)
    return pd.Series(values, dtype=object)


def as_float(values: Sequence | pd.Series, column: str, where: Where) -> np.ndarray:
    """Finite float64 values; the first non-number raises naming its line."""
    series = _as_series(values)
    numbers = pd.to_numeric(series, errors="coerce").to_numpy(np.float64, na_value=np.nan)
    bad = ~np.isfinite(numbers)
    if bad.any():
        row = int(np.argmax(bad))
        raise where.error(row, _bad_value(series, row, "a number"), column)
    return numbers


def as_int(values: Sequence | pd.Series, column: str, where: Where) -> np.ndarray:
    """Integer int64 values (3.0 is accepted, 3.5 is not); the first bad one raises."""
    series = _as_series(values)
    numbers = pd.to_numeric(series, errors="coerce")
    if pd.api.types.is_integer_dtype(numbers.dtype):
        return numbers.to_numpy(np.int64)
    floats = numbers.to_numpy(np.float64, na_value=np.nan)
    bad = ~(np.isfinite(floats) & (floats == np.round(floats)))
    if bad.any():
        row = int(np.argmax(bad))
        raise where.error(row, _bad_value(series, row, "an integer"), column)
    return floats.astype(np.int64)


def as_str(values: Sequence | pd.Series, column: str, where: Where) -> pd.Series:
    """Non-blank strings (integers are accepted and turned into strings)."""
    series = _as_series(values)
    for row, value in enumerate(series):
        wrong_type = isinstance(value, bool) or not isinstance(value, (str, int, np.integer))
        if wrong_type or _is_missing(value):
            raise where.error(row, _bad_value(series, row, "a string"), column)
    return series.astype(str)


def as_hash_lists(values: Sequence | pd.Series, column: str, where: Where) -> list[list[int]]:
    """Lists of int block ids (a list of digit strings is fine: CSV cells split on spaces)."""
    lists = []
    for row, value in enumerate(values):
        if type(value) is list and all(type(item) is int for item in value):
            lists.append(value)  # the JSON case, kept as is (type() also rules out bools)
            continue
        try:
            if not isinstance(value, (list, tuple, np.ndarray)):
                raise TypeError
            if any(isinstance(item, (bool, float)) for item in value):
                raise TypeError  # 1.5 or true is not a block id, though int() would take it
            ids = [int(item) for item in value]
        except (TypeError, ValueError):
            problem = f"expected a list of integer block ids, got {value!r}"
            raise where.error(row, problem, column) from None
        lists.append(ids)
    return lists


def check_table(table: pd.DataFrame, where: Where) -> None:
    """Check the trace schema and values: the invariants every Trace holds."""
    missing = [name for name in REQUIRED_COLUMNS if name not in table.columns]
    unknown = [name for name in table.columns if name not in COLUMNS]
    if missing or unknown:
        problem = f"missing columns {missing}" if missing else f"unknown columns {unknown}"
        raise where.error(None, problem)
    if len(table) == 0:
        raise where.error(None, "no requests")
    _check_dtypes(table, where)
    _check_arrivals(table["arrival_s"].to_numpy(), where)
    _check_prefix_tokens(table, where)
    _check_sessions(table, where)
    for column in ("prompt_len", "output_len"):
        lengths = table[column].to_numpy()
        if (lengths < 1).any():
            row = int(np.argmax(lengths < 1))
            raise where.error(row, f"must be >= 1, got {lengths[row]}", column)
    duplicated = table["request_id"].duplicated().to_numpy()
    if duplicated.any():
        row = int(np.argmax(duplicated))
        problem = f"duplicate request id {table['request_id'].iloc[row]!r}"
        raise where.error(row, problem, "request_id")


def _check_dtypes(table: pd.DataFrame, where: Where) -> None:
    expected = {"arrival_s": "float64", "prompt_len": "int64", "output_len": "int64"}
    for column, dtype in (("priority", "int64"), ("turn", "int64"), ("think_s", "float64")):
        if column in table.columns:
            expected[column] = dtype
    for column, dtype in expected.items():
        if table[column].dtype != dtype:
            raise where.error(None, f"dtype must be {dtype}, got {table[column].dtype}", column)
    for column in ("request_id", "tenant", "session_id"):
        if column in table.columns and not pd.api.types.is_string_dtype(table[column]):
            raise where.error(None, "must hold strings", column)


def _check_arrivals(arrival_s: np.ndarray, where: Where) -> None:
    bad = ~np.isfinite(arrival_s)
    if bad.any():
        row = int(np.argmax(bad))
        raise where.error(row, f"must be finite, got {arrival_s[row]}", "arrival_s")
    backwards = np.diff(arrival_s) < 0  # equal times are fine: Mooncake has 0.3% zero gaps
    if backwards.any():
        row = int(np.argmax(backwards)) + 1
        problem = f"time goes backwards ({arrival_s[row]:.6f} s after {arrival_s[row - 1]:.6f} s); "
        raise where.error(row, problem + "rows must be sorted by arrival time", "arrival_s")
    if arrival_s[0] != 0.0:
        raise where.error(0, f"first arrival must be 0, got {arrival_s[0]!r}", "arrival_s")


def _check_prefix_tokens(table: pd.DataFrame, where: Where) -> None:
    """Token counts match their ids one for one, are >= 1, and never outrun the prompt."""
    if "prefix_hash_tokens" not in table.columns:
        return
    if "prefix_hash_ids" not in table.columns:
        raise where.error(None, "needs the prefix_hash_ids column", "prefix_hash_tokens")
    columns = ("prefix_hash_ids", "prefix_hash_tokens", "prompt_len")
    rows = zip(*(table[column] for column in columns), strict=True)
    for row, (ids, tokens, prompt_len) in enumerate(rows):
        if len(ids) != len(tokens):
            problem = f"{len(tokens)} token counts for {len(ids)} prefix hash ids"
            raise where.error(row, problem, "prefix_hash_tokens")
        if any(count < 1 for count in tokens):
            raise where.error(row, f"counts must be >= 1, got {list(tokens)}", "prefix_hash_tokens")
        if sum(tokens) > prompt_len:
            problem = f"the prefix ({sum(tokens)} tokens) is longer than the prompt ({prompt_len})"
            raise where.error(row, problem, "prefix_hash_tokens")


def _check_sessions(table: pd.DataFrame, where: Where) -> None:
    """session_id, turn and think_s come together; turns count from 0, think times >= 0."""
    present = [c for c in ("session_id", "turn", "think_s") if c in table.columns]
    if not present:
        return
    if len(present) != 3:
        missing = sorted({"session_id", "turn", "think_s"} - set(present))
        raise where.error(None, f"{present} need {missing} as well", present[0])
    turn, think_s = table["turn"].to_numpy(), table["think_s"].to_numpy()
    for column, bad, problem in (
        ("turn", turn < 0, "must be >= 0"),
        ("think_s", ~(think_s >= 0) | ~np.isfinite(think_s), "must be finite and >= 0"),
    ):
        if bad.any():
            row = int(np.argmax(bad))
            value = table[column].iloc[row]
            raise where.error(row, f"{problem}, got {value}", column)
