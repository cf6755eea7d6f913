"""`Trace`: the one table type for request traces, real or synthetic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workloads.validate import Where, check_table

# Prefix hash ids name prefix blocks of this many prompt tokens (Mooncake's block size).
PREFIX_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class SessionColumns:
    """Where each row sits in a conversation: the closed-loop driver's schedule."""

    session_id: Sequence[str]
    turn: Sequence[int]  # 0 for a session's first request
    think_s: Sequence[float]  # seconds from the previous turn's last token to this turn


@dataclass(frozen=True, eq=False, repr=False)
class Trace:
    """A named request table; the constructor checks the schema and never copies.

    Columns: arrival_s (float64 seconds, 0 first, non-decreasing), prompt_len and
    output_len (int64 tokens >= 1), request_id (unique str); optional tenant (str),
    priority (int64), prefix_hash_ids (a list of int ids per row: equal ids, equal
    content), prefix_hash_tokens (the tokens each id covers, a list per row; without it each
    id covers PREFIX_BLOCK_TOKENS), and session_id (str), turn (int64) and think_s (float64):
    a row is turn `turn` of `session_id`, sent `think_s` after the previous turn's answer.
    """

    name: str
    table: pd.DataFrame

    def __post_init__(self) -> None:
        check_table(self.table, Where(self.name, unit="row"))

    @classmethod
    def from_arrays(
        cls,
        name: str,
        arrival_s: Sequence[float] | np.ndarray,
        prompt_len: Sequence[int] | np.ndarray,
        output_len: Sequence[int] | np.ndarray,
        request_ids: Sequence[str] | None = None,
        tenant: Sequence[str] | None = None,
        priority: Sequence[int] | None = None,
        prefix_hash_ids: Sequence[Sequence[int]] | None = None,
        prefix_hash_tokens: Sequence[Sequence[int]] | None = None,
        sessions: SessionColumns | None = None,
    ) -> Trace:
        """Build a trace from columns; request ids default to "0", "1", ..."""
        ids = np.arange(len(arrival_s)).astype(str) if request_ids is None else request_ids
        columns = {
            "arrival_s": np.asarray(arrival_s, dtype=np.float64),
            "prompt_len": np.asarray(prompt_len, dtype=np.int64),
            "output_len": np.asarray(output_len, dtype=np.int64),
            "request_id": pd.Series(list(ids), dtype=str),
        }
        if tenant is not None:
            columns["tenant"] = pd.Series(list(tenant), dtype=str)
        if priority is not None:
            columns["priority"] = np.asarray(priority, dtype=np.int64)
        if prefix_hash_ids is not None:
            lists = [[int(block) for block in blocks] for blocks in prefix_hash_ids]
            columns["prefix_hash_ids"] = pd.Series(lists, dtype=object)
        if prefix_hash_tokens is not None:
            lists = [[int(count) for count in counts] for counts in prefix_hash_tokens]
            columns["prefix_hash_tokens"] = pd.Series(lists, dtype=object)
        if sessions is not None:
            columns["session_id"] = pd.Series(list(sessions.session_id), dtype=str)
            columns["turn"] = np.asarray(sessions.turn, dtype=np.int64)
            columns["think_s"] = np.asarray(sessions.think_s, dtype=np.float64)
        return cls(name, pd.DataFrame(columns))

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        return f"Trace(name={self.name!r}, requests={len(self)}, span_s={self.span_s:.1f})"

    @property
    def arrival_s(self) -> np.ndarray:
        """Arrival times in seconds from the first request (read-only view)."""
        return _readonly(self.table["arrival_s"])

    @property
    def prompt_len(self) -> np.ndarray:
        """Prompt lengths in tokens (read-only view)."""
        return _readonly(self.table["prompt_len"])

    @property
    def output_len(self) -> np.ndarray:
        """Output lengths in tokens (read-only view)."""
        return _readonly(self.table["output_len"])

    @property
    def request_ids(self) -> list[str]:
        """Request ids, in arrival order."""
        return self.table["request_id"].tolist()

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last arrival."""
        return float(self.table["arrival_s"].iloc[-1])

    @property
    def has_prefix_hashes(self) -> bool:
        """Whether rows carry prefix block ids."""
        return "prefix_hash_ids" in self.table.columns

    @property
    def has_sessions(self) -> bool:
        """Whether rows carry session_id, turn and think_s (a closed-loop schedule)."""
        return "session_id" in self.table.columns

    def prefix_tokens(self) -> list[list[int]]:
        """Tokens each prefix hash id covers, per row (PREFIX_BLOCK_TOKENS each if unstated)."""
        if "prefix_hash_tokens" in self.table.columns:
            return self.table["prefix_hash_tokens"].tolist()
        return [[PREFIX_BLOCK_TOKENS] * len(ids) for ids in self.table["prefix_hash_ids"]]


def _readonly(column: pd.Series) -> np.ndarray:
    view = column.to_numpy().view()  # a new array object over the same memory
    view.flags.writeable = False  # only this view is locked; pandas keeps its own
    return view
