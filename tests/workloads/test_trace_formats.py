"""Format detection, forced formats and the own-schema round trip (CSV, JSONL, Parquet)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workloads import Trace, TraceError, detect_format, load_trace, open_trace, save_trace

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:50.9951690,12,3"  # a tie, and no trailing newline, as in the real files
)
MOONCAKE = (
    '{"timestamp": 0, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]}\n'
    '{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [0]}\n'
    '{"timestamp": 1500, "input_length": 1025, "output_length": 1, "hash_ids": [0, 2, 3]}\n'
)


def rich_trace() -> Trace:
    """A trace using every optional column, with awkward float times."""
    return Trace.from_arrays(
        "rich",
        arrival_s=[0.0, 0.1 + 0.2, 0.1 + 0.2, 1 / 3, 12345.678901234567],
        prompt_len=[1, 512, 513, 7, 100_000],
        output_len=[5, 1, 2, 3, 4],
        request_ids=["a", "007", "c d", "x,y", "e"],
        tenant=["t1", "t2", "t1", "t3", "t2"],
        priority=[0, -1, 5, 2**40, 3],
        prefix_hash_ids=[[], [1], [1, 2], [9], list(range(196))],
    )


def test_azure_csv_is_detected_and_times_are_exact(write_file: Callable) -> None:
    path = write_file("trace.txt", AZURE)  # the extension says nothing
    assert detect_format(path) == "azure"
    trace = load_trace(path)
    assert trace.name == "trace.txt"
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 4.314579, 4.314579])
    np.testing.assert_array_equal(trace.prompt_len, [374, 396, 12])
    np.testing.assert_array_equal(trace.output_len, [44, 109, 3])


def test_mooncake_jsonl_is_detected_with_ms_times_and_hashes(write_file: Callable) -> None:
    path = write_file("m.dat", MOONCAKE)
    assert detect_format(path) == "mooncake"
    trace = load_trace(path)
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 0.0, 1.5])
    assert trace.table["prefix_hash_ids"].tolist() == [[0, 1], [0], [0, 2, 3]]


def test_forced_format_skips_detection(write_file: Callable) -> None:
    path = write_file("m.jsonl", MOONCAKE)
    assert len(load_trace(path, fmt="mooncake")) == 3
    with pytest.raises(TraceError, match="arrival_s"):
        load_trace(path, fmt="jsonl")  # forced wrong: own schema lacks arrival_s
    with pytest.raises(ValueError, match="unknown trace format 'xml'"):
        load_trace(path, fmt="xml")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_own_schema_round_trips_exactly(tmp_path: Path, suffix: str) -> None:
    original = rich_trace()
    path = tmp_path / f"out{suffix}"
    save_trace(original, path)
    assert detect_format(path) == suffix[1:]
    loaded = load_trace(path, name="rich")
    pd.testing.assert_frame_equal(
        loaded.table.astype({"request_id": object, "tenant": object}),
        original.table.astype({"request_id": object, "tenant": object}),
    )
    assert loaded.arrival_s.tobytes() == original.arrival_s.tobytes()  # bit for bit


def test_own_schema_minimal_columns_get_default_ids(write_file: Callable) -> None:
    path = write_file("own.csv", "arrival_s,prompt_len,output_len,extra\n5.5,10,2,x\n6,3.0,1,y\n")
    trace = load_trace(path)
    assert trace.request_ids == ["0", "1"]
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 0.5])  # shifted to start at 0
    assert list(trace.table.columns) == ["arrival_s", "prompt_len", "output_len", "request_id"]


def test_blank_lines_are_skipped_and_line_numbers_stay_true(write_file: Callable) -> None:
    path = write_file("own.csv", "arrival_s,prompt_len,output_len\n0,1,1\n\n1,2,2\n\n2,0,3\n")
    with pytest.raises(TraceError, match=r"own.csv: line 6: prompt_len: must be >= 1"):
        load_trace(path)


def test_save_refuses_unknown_suffix_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="out.txt"):
        save_trace(rich_trace(), tmp_path / "out.txt")
    assert list(tmp_path.iterdir()) == []


def test_open_trace_resolves_names_specs_and_files(write_file: Callable) -> None:
    path = write_file("a.csv", AZURE)
    assert len(open_trace(str(path))) == 3
    assert len(open_trace("synthetic:n=5,rate=1")) == 5
    with pytest.raises(FileNotFoundError, match="nope.csv.*azure-conv"):
        open_trace("nope.csv")
    with pytest.raises(ValueError, match="format applies to trace files"):
        open_trace("synthetic:n=5,rate=1", fmt="csv")
