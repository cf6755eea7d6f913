"""vLLM request records (LLMServingSim's bench format) as a trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.formats.loaders import detect_format, load_trace
from workloads.validate import TraceError


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_records_load_with_arrivals_from_zero(tmp_path: Path) -> None:
    path = _write(tmp_path / "requests.jsonl", [
        {"request_id": "bench-0", "input_toks": 100, "output_toks": 7,
         "arrival_time": 1777142838.5, "first_token_ts": 9.0},
        {"request_id": "bench-1", "input_toks": 50, "output_toks": 3,
         "arrival_time": 1777142839.0},
    ])
    assert detect_format(path) == "vllm-requests"
    trace = load_trace(path)
    assert list(trace.table["arrival_s"]) == [0.0, 0.5]
    assert list(trace.table["prompt_len"]) == [100, 50]
    assert list(trace.table["request_id"]) == ["bench-0", "bench-1"]


def test_a_missing_field_names_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "requests.jsonl", [
        {"request_id": "a", "input_toks": 1, "output_toks": 1, "arrival_time": 1.0},
        {"request_id": "b", "input_toks": 1, "arrival_time": 2.0},
    ])
    with pytest.raises(TraceError, match="output_toks"):
        load_trace(path)
