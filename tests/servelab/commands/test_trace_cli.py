"""`servelab trace`, run in-process: summaries, --json, --save, transforms and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.cli import main
from workloads import load_trace


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(["trace", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_conv_summary_prints_published_numbers(capsys: pytest.CaptureFixture) -> None:
    code, out, err = run(capsys, "azure-conv")
    assert code == 0 and err == ""
    for words in (
        "19366",
        "3501.7",
        "5.53",
        "1.09",
        "burst_peak_1s    16",
        "1154.7",
        "1020.0",
        "4142.0",
        "211.1",
        "129.0",
        "601.0",
    ):
        assert words in out


def test_json_holds_the_statistics(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "conv.json"
    code, _, _ = run(capsys, "azure-conv", "--json", str(path))
    assert code == 0
    stats = json.loads(path.read_text())["trace"]
    assert stats["name"] == "azure-conv" and stats["requests"] == 19_366
    assert round(stats["span_s"], 1) == 3501.7 and round(stats["rate_per_s"], 2) == 5.53
    assert round(stats["interarrival_cv"], 2) == 1.09 and stats["burst_peak_1s"] == 16
    assert (stats["prompt_len_p50"], stats["prompt_len_p99"]) == (1020, 4142)
    assert (stats["output_len_p50"], stats["output_len_p99"]) == (129, 601)


def test_code_and_mooncake_summaries(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "azure-code")
    assert code == 0 and "8819" in out and "13.15" in out and "burst_peak_1s    67" in out
    code, out, _ = run(capsys, "mooncake-synthetic")
    assert code == 0 and "3993" in out and "121877 (43924 unique)" in out


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_save_converts_with_transforms(
    tmp_path: Path, capsys: pytest.CaptureFixture, suffix: str
) -> None:
    path = tmp_path / f"small{suffix}"
    code, out, _ = run(
        capsys,
        "mooncake-synthetic",
        "--max-requests",
        "50",
        "--qps-scale",
        "2",
        "--max-prompt-len",
        "1024",
        "--save",
        str(path),
    )
    assert code == 0 and "requests         50" in out
    saved = load_trace(path)
    assert len(saved) == 50 and saved.prompt_len.max() <= 1024
    assert all(len(ids) <= 2 for ids in saved.table["prefix_hash_ids"])
    code, again, _ = run(capsys, str(path))  # the saved file reads back to the same summary
    assert code == 0 and again.splitlines()[1:] == out.splitlines()[1:]


def test_synthetic_spec_with_seed(capsys: pytest.CaptureFixture) -> None:
    spec = "synthetic:n=300,rate=4,arrival=gamma,cv=2,prompt=lognormal(512,0.5),output=fixed(9)"
    code, first, _ = run(capsys, spec, "--seed", "3")
    _, same, _ = run(capsys, spec, "--seed", "3")
    _, other, _ = run(capsys, spec, "--seed", "4")
    assert code == 0 and "requests         300" in first
    assert first == same and first != other


def test_time_window_and_length_scale(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(
        capsys, "azure-conv", "--start-s", "100", "--end-s", "200", "--length-scale", "0.5"
    )
    assert code == 0 and "span_s           99." in out


def test_bad_trace_file_is_one_line_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.0,x,3"
    )
    saved = tmp_path / "out.csv"
    code, out, err = run(
        capsys, str(path), "--save", str(saved), "--json", str(tmp_path / "s.json")
    )
    assert code == 2 and out == ""
    assert (
        err == f"servelab trace: error: {path}: line 3: ContextTokens: "
        "expected an integer, got 'x'\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]  # nothing written


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["no-such-trace.csv"], "no such file"),
        (["synthetic:n=5,rate=1,prompt=zipf(2)"], "unknown distribution 'zipf'"),
        (["azure-conv", "--qps-scale", "0"], "--qps-scale: expected a number > 0"),
        (["azure-conv", "--start-s", "9999"], "no requests in the window"),
        (["azure-conv", "--format", "csv"], "format applies to trace files"),
    ],
)
def test_errors_are_one_line_exit_2(
    capsys: pytest.CaptureFixture, argv: list[str], words: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("servelab trace: error: ") and err.count("\n") == 1 and words in err


def test_save_with_unknown_suffix_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code, _, err = run(capsys, "azure-code", "--save", str(tmp_path / "x.xlsx"))
    assert code == 2 and "x.xlsx" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_forced_format_flag(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "trace.log"
    path.write_text('{"timestamp": 0, "input_length": 3, "output_length": 2}\n')
    code, out, _ = run(capsys, str(path), "--format", "mooncake")
    assert code == 0 and "requests         1" in out


def test_help_documents_the_spec_grammar(capsys: pytest.CaptureFixture) -> None:
    assert main(["trace", "--help"]) == 0
    out = capsys.readouterr().out
    for words in (
        "synthetic:KEY=VALUE",
        "lognormal(MED,SIG)",
        "pareto(MIN,ALPHA)",
        "empirical(T)",
        "arrival=gamma",
        "azure-conv",
        "--qps-scale",
    ):
        assert words in out
