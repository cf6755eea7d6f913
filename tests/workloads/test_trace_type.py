"""The Trace type: cheap accessors, and the schema invariants its constructor enforces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workloads import Trace, TraceError
from workloads.formats.files import atomic_output


def test_accessors_are_numpy_and_read_only() -> None:
    trace = Trace.from_arrays("t", [0.0, 0.5, 2.0], [4, 5, 6], [1, 2, 3])
    assert len(trace) == 3 and trace.span_s == 2.0
    assert trace.request_ids == ["0", "1", "2"]
    assert trace.arrival_s.dtype == np.float64 and trace.prompt_len.dtype == np.int64
    with pytest.raises(ValueError, match="read-only"):
        trace.prompt_len[0] = 99
    assert trace.table["prompt_len"].iloc[0] == 4
    assert repr(trace) == "Trace(name='t', requests=3, span_s=2.0)"


@pytest.mark.parametrize(
    ("columns", "words"),
    [
        (
            {"arrival_s": [0.0, 1.0], "prompt_len": [1, 0], "output_len": [1, 1]},
            "t: row 2: prompt_len: must be >= 1, got 0",
        ),
        (
            {"arrival_s": [0.0, 2.0, 1.0], "prompt_len": [1, 1, 1], "output_len": [1, 1, 1]},
            "t: row 3: arrival_s: time goes backwards",
        ),
        (
            {"arrival_s": [1.0, 2.0], "prompt_len": [1, 1], "output_len": [1, 1]},
            "t: row 1: arrival_s: first arrival must be 0",
        ),
        (
            {"arrival_s": [0.0, np.nan], "prompt_len": [1, 1], "output_len": [1, 1]},
            "t: row 2: arrival_s: must be finite",
        ),
        ({"arrival_s": [], "prompt_len": [], "output_len": []}, "t: no requests"),
    ],
)
def test_constructor_rejects_broken_tables(columns: dict, words: str) -> None:
    with pytest.raises(TraceError, match="^" + words.replace("(", r"\(")):
        Trace.from_arrays("t", **columns)


def test_constructor_checks_columns_and_dtypes() -> None:
    table = pd.DataFrame(
        {"arrival_s": [0.0], "prompt_len": [1], "output_len": [1], "request_id": ["a"]}
    )
    with pytest.raises(TraceError, match="missing columns"):
        Trace("t", table.drop(columns="request_id"))
    with pytest.raises(TraceError, match="unknown columns"):
        Trace("t", table.assign(colour="red"))
    with pytest.raises(TraceError, match="prompt_len: dtype must be int64"):
        Trace("t", table.assign(prompt_len=[1.0]))
    with pytest.raises(TraceError, match="request_id: duplicate"):
        Trace.from_arrays("t", [0.0, 1.0], [1, 1], [1, 1], request_ids=["x", "x"])


def test_atomic_output_leaves_old_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(target) as temp:
        temp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    with atomic_output(target) as temp:
        temp.write_text("new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
