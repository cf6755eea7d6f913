"""An engine's step records, kept as numbers: a sequence of StepRecord built only when read.

A replay makes one record per engine step, millions in a large one. As tuple objects (each
with float and int objects of its own) they took 350 MB more at a million requests over 32
replicas. The log keeps each step's fields packed as doubles in one buffer (every field is
exact in one: two times, then counts far below 2**53), hands the whole table to numpy in one
copy, and makes a StepRecord only for the one read. The engine records a step with
`log.add_packed(pack(*fields))`: two calls into C, no object kept.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, overload

import numpy as np


class StepRecord(NamedTuple):
    """One executed step, as the per-step table and the timeline chart read it."""

    start_s: float  # when the step began
    duration_s: float  # how long it took (predicted or measured)
    batch_size: int  # rows in the forward, padding included
    num_tokens: int  # tokens computed, padding included
    prefill_tokens: int  # prompt/recompute chunk tokens
    decode_seqs: int  # one-token rows, padding included
    padding_rows: int  # static batching: finished rows still computed
    kv_blocks_used: int  # after the step's retirements
    num_waiting: int  # queue length after the step
    num_running: int  # running requests after the step
    num_preempted: int  # evictions decided for this step


FIELDS = StepRecord._fields
WIDTH = len(FIELDS)
_TIMES = 2  # the leading float fields; the rest are counts
_STEP = struct.Struct(f"{WIDTH}d")
STEP_BYTES = _STEP.size
pack = _STEP.pack  # one step's fields (StepRecord's order) as the log stores them


def _record(row: Sequence[float]) -> StepRecord:
    return StepRecord._make((row[0], row[1], *map(int, row[_TIMES:])))


class StepLog(Sequence[StepRecord]):
    """Step records in the order they were added (`add`: one step's fields in StepRecord's
    order; `add_packed`: the same, packed by `pack`)."""

    __slots__ = ("_buf", "add_packed")

    def __init__(self, records: Iterable[Sequence[float]] = ()) -> None:
        self._buf = bytearray()
        # add_packed(pack(*fields)): append one step (the engine's path, once per step).
        self.add_packed = self._buf.extend
        for fields in records:
            self.add(fields)

    def add(self, fields: Sequence[float]) -> None:
        """Append one step: its fields in StepRecord's order."""
        if len(fields) != WIDTH:
            raise ValueError(f"a step record has {WIDTH} fields, got {len(fields)}")
        self._buf += pack(*fields)

    @classmethod
    def concat(cls, logs: Iterable[StepLog]) -> StepLog:
        """One log holding every step of `logs`, log after log."""
        out = cls()
        for log in logs:
            out._buf += log._buf
        return out

    def __len__(self) -> int:
        return len(self._buf) // STEP_BYTES

    @overload
    def __getitem__(self, index: int) -> StepRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[StepRecord]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("step index out of range")
        return _record(_STEP.unpack_from(self._buf, index * STEP_BYTES))

    def __iter__(self) -> Iterator[StepRecord]:
        for row in _STEP.iter_unpack(bytes(self._buf)):
            yield _record(row)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepLog):
            return self._buf == other._buf
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (mutable)

    def __repr__(self) -> str:
        return f"StepLog({len(self)} steps)"

    def clear(self) -> None:
        del self._buf[:]

    def column(self, name: str) -> list[float]:
        """One field of every step, in order (as floats)."""
        return np.frombuffer(bytes(self._buf), dtype=float)[FIELDS.index(name)::WIDTH].tolist()

    def table(self) -> np.ndarray:
        """Every step as a row of a (steps x fields) float array: a copy. (Read from a
        snapshot taken in one call: the buffer is never exported while the engine may grow
        it, which a live export forbids.)"""
        return np.frombuffer(bytes(self._buf), dtype=float).reshape(-1, WIDTH).copy()


def step_array(steps: Sequence[Sequence[float]]) -> np.ndarray:
    """Steps (a StepLog, or records) as a (steps x fields) float array."""
    if isinstance(steps, StepLog):
        return steps.table()
    return np.array(steps, dtype=float).reshape(-1, WIDTH)
