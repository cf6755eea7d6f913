"""Every malformed input raises a TraceError naming the file, the line (or row) and the field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from workloads import TraceError, load_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD_AZURE_ROW = "2023-11-16 18:15:46.6805900,374,44\n"
OWN_HEADER = "arrival_s,prompt_len,output_len,request_id,prefix_hash_ids\n"


def moon(ts: object = 0, inp: object = 10, out: object = 2, hashes: object = "[1]") -> str:
    return (
        f'{{"timestamp": {ts}, "input_length": {inp}, "output_length": {out}, '
        f'"hash_ids": {hashes}}}\n'
    )


# (file name, content, line, field or None, words the message must contain)
CASES = [
    (
        "neg.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-11-16 18:15:47.1,-5,3",
        3,
        "ContextTokens",
        "must be >= 1, got -5",
    ),
    (
        "zero.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-11-16 18:15:47.1,5,0",
        3,
        "GeneratedTokens",
        "must be >= 1, got 0",
    ),
    (
        "frac.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-11-16 18:15:47.1,5,12.5",
        3,
        "GeneratedTokens",
        "expected an integer, got 12.5",
    ),
    (
        "nan.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-11-16 18:15:47.1,NaN,3",
        3,
        "ContextTokens",
        "expected an integer, got 'NaN'",
    ),
    (
        "empty_cell.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-11-16 18:15:47.1,,3",
        3,
        "ContextTokens",
        "missing value",
    ),
    (
        "short_row.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-11-16 18:15:47.1,5",
        3,
        "GeneratedTokens",
        "missing value",
    ),
    (
        "unsorted.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-11-16 18:15:47.1,5,3\n2023-11-16 18:15:40.0,5,3\n",
        4,
        "TIMESTAMP",
        "goes backwards",
    ),
    (
        "stamp.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-11-16T18:15:47,5,3",
        3,
        "TIMESTAMP",
        "expected 'YYYY-MM-DD HH:MM:SS.fffffff'",
    ),
    (
        "month13.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-13-16 18:15:47.1,5,3",
        3,
        "TIMESTAMP",
        "2023-13-16",
    ),
    (
        "ragged.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-11-16 18:15:47.1,5,3,9\n",
        3,
        None,
        "malformed CSV",
    ),
    (
        "nocol.csv",
        "TIMESTAMP,ContextTokens,Generated\n" + GOOD_AZURE_ROW,
        1,
        None,
        "unrecognised trace format",
    ),
    ("own_nocol.csv", "arrival_s,prompt_len\n0,5\n", 1, "output_len", "missing column"),
    ("empty.csv", "", 1, None, "file is empty"),
    ("blank.jsonl", "\n\n  \n", 1, None, "file is empty"),
    ("header_only.csv", AZURE_HEADER, 2, None, "no requests"),
    (
        "dup_id.csv",
        OWN_HEADER + "0,5,5,a,\n1,5,5,b,\n2,5,5,a,\n",
        4,
        "request_id",
        "duplicate request id 'a'",
    ),
    (
        "bad_hash.csv",
        OWN_HEADER + "0,5,5,a,1 2\n1,5,5,b,1 x\n",
        3,
        "prefix_hash_ids",
        "list of integer block ids",
    ),
    ("inf.csv", OWN_HEADER + "0,5,5,a,\ninf,5,5,b,\n", 3, "arrival_s", "expected a number"),
    (
        "broken.jsonl",
        moon() + moon(ts=5) + '{"timestamp": 9, "input_length": \n',
        3,
        None,
        "malformed JSON",
    ),
    (
        "array.jsonl",
        '{"arrival_s": 0, "prompt_len": 1, "output_len": 1}\n[1, 2]\n',
        2,
        None,
        "expected a JSON object",
    ),
    (
        "nokey.jsonl",
        moon() + '{"timestamp": 5, "output_length": 3}\n',
        2,
        "input_length",
        "missing key",
    ),
    ("neg.jsonl", moon() + moon(ts=5, out=-1), 2, "output_length", "must be >= 1"),
    (
        "str_len.jsonl",
        moon() + moon(ts=5, inp='"many"'),
        2,
        "input_length",
        "expected an integer, got 'many'",
    ),
    ("hash.jsonl", moon() + moon(ts=5, hashes='"1 2"'), 2, "hash_ids", "block ids"),
    ("float_hash.jsonl", moon() + moon(ts=5, hashes="[1.5]"), 2, "hash_ids", "block ids"),
    ("back.jsonl", moon(ts=10) + moon(ts=10) + moon(ts=4), 3, "timestamp", "goes backwards"),
    ("null.jsonl", moon() + moon(ts="null"), 2, "timestamp", "missing value"),
    (
        "own_tenant.jsonl",
        '{"arrival_s": 0, "prompt_len": 1, "output_len": 1, "tenant": "a"}\n'
        '{"arrival_s": 1, "prompt_len": 1, "output_len": 1}\n',
        2,
        "tenant",
        "missing value",
    ),
]


@pytest.mark.parametrize(
    ("name", "text", "line", "field", "words"), CASES, ids=[case[0] for case in CASES]
)
def test_bad_file_names_file_line_and_field(
    write_file: Callable, name: str, text: str, line: int, field: str | None, words: str
) -> None:
    path = write_file(name, text)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: line {line}: "), message
    assert words in message
    assert caught.value.line == line and caught.value.field == field
    if field:
        assert f": {field}: " in message
    assert "\n" not in message


def test_parquet_errors_name_the_row(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_len": [3, 0], "output_len": [1, 1]}).to_parquet(
        path
    )
    with pytest.raises(TraceError, match=rf"^{path}: row 2: prompt_len: must be >= 1, got 0$"):
        load_trace(path)


def test_corrupt_parquet_names_the_file(write_file: Callable) -> None:
    path = write_file("c.parquet", "PAR1 not really parquet")
    with pytest.raises(TraceError, match=rf"^{path}: not a readable Parquet file"):
        load_trace(path)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("g.csv", b"arrival_s,prompt_len,output_len\n0,1,1\n1,1,\xff\xfe\n"),
        ("g.jsonl", b'{"arrival_s": 0, "prompt_len": 1, "output_len": 1}\n\n{"a\xff": 1}\n'),
    ],
)
def test_binary_garbage_names_its_line(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TraceError, match=rf"^{path}: line 3: not UTF-8 text"):
        load_trace(path)


def test_ties_are_allowed_everywhere(write_file: Callable) -> None:
    path = write_file("tie.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + GOOD_AZURE_ROW * 3)
    assert load_trace(path).arrival_s.tolist() == [0.0, 0.0, 0.0]
