"""`Trace`: the one table type for request traces, real or synthetic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workloads.validate import Where, check_table

# Prefix hash ids name prefix blocks of this many prompt tokens (Mooncake's block size).
PREFIX_BLOCK_TOKENS = 512


@dataclass(frozen=True, eq=False, repr=False)
class Trace:
    """A named request table; the constructor checks the schema and never copies.

    Columns: arrival_s (float64 seconds, 0 first, non-decreasing), prompt_len and
    output_len (int64 tokens >= 1), request_id (unique str); optional tenant (str),
    priority (int64) and prefix_hash_ids (a list of int block ids per row).
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


def _readonly(column: pd.Series) -> np.ndarray:
    view = column.to_numpy().view()  # a new array object over the same memory
    view.flags.writeable = False  # only this view is locked; pandas keeps its own
    return view
