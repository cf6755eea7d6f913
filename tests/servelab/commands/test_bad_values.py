"""Every subcommand answers a bad value with one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.cli import main

ROOT = Path(__file__).resolve().parents[3]
TRACE = ["--trace", "azure-code", "--max-requests", "5"]

# (command line, a bad flag and value): each run must fail before any work starts.
BAD = [
    *[(["simulate", *TRACE, flag, value]) for flag, value in (
        ("--tp", "0"), ("--qps-scale", "abc"), ("--qps-scale", "-1"), ("--qps-scale", "nan"),
        ("--max-num-seqs", "0"), ("--block-size", "0"), ("--num-blocks", "-3"),
        ("--gpu-memory-utilization", "1.5"), ("--data-parallel-size", "0"),
        ("--max-model-len", "x"), ("--replicas", "0"), ("--seed", "-1"), ("--users", "0"),
        ("--slo-ttft-ms", "inf"), ("--hardware", "x"), ("--model", "no-such-model"),
        ("--pd", "1:0"))],
    ["compare", *TRACE, "--policies", "static,,chunked"],
    ["compare", *TRACE, "--workers", "0"],
    ["sweep", *TRACE, "--tp", "0"],
    ["sweep", *TRACE, "--qps-scales", "1,abc"],
    ["plan", *TRACE, "--hardware", "h100,,x"],
    ["plan", *TRACE, "--tp", "0"],
    ["plan", *TRACE, "--slo-ttft-p99-ms", "0"],
    ["trace", "azure-code", "--max-requests", "0"],
    ["serve", "--simulate", "--tp", "0"],
    ["serve", "--simulate", "--port", "70000"],
    ["run", *TRACE, "--top-p", "2"],
    ["validate", *TRACE, "--max-failed-share", "-0.1"],
    ["calibrate", "--repeats", "0"],
    ["bench-serve", "--url", "http://127.0.0.1:9", *TRACE, "--request-rate", "-2"],
    ["route", "--port", "-1"],
    ["report", "--workers", "0"],
    ["fidelity-gpu", "--silicon-rounds", "0"],
    ["simulate", *TRACE, "--request-rate", "0"],
    ["simulate", "--trace", "synthetic:tenant=a,n=5,rate=1,system=x;tenant=b,n=5,rate=1"],
    ["sweep", *TRACE, "--slo-ttft-p99-ms", "-5"],
]


@pytest.mark.parametrize("argv", BAD, ids=lambda argv: " ".join(argv[:1] + argv[-2:]))
def test_bad_value_is_one_line_and_exit_2(argv: list[str], capsys) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Error:" not in err.split("error:", 1)[0]
    assert lines[0].startswith(f"servelab {argv[0]}: error: ")


def test_a_closed_pipe_ends_quietly() -> None:
    """`servelab ... | head -1` prints no BrokenPipeError: here the reader is gone before the
    first write, so every write (and the final flush) meets a closed pipe."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "servelab", "simulate", "--trace",
                               "azure-code", "--max-requests", "20"], stdout=write_end,
                              stderr=subprocess.PIPE, cwd=ROOT, check=False)
    finally:
        os.close(write_end)
    assert done.stderr == b"" and done.returncode == 141


def test_a_run_that_serves_nothing_exits_non_zero(capsys) -> None:
    assert main(["simulate", *TRACE, "--max-model-len", "10"]) == 1
    captured = capsys.readouterr()
    assert "rejected 5 of 5 requests" in captured.out
    assert "exceeds max_model_len=10" in captured.out
    assert captured.err.strip().splitlines() == [
        "servelab simulate: error: continuous served no request (see the rejections above)"]


def test_every_shown_flag_has_help_and_one_spelling_each() -> None:
    """Each visible option says what it does; an old spelling is hidden, not listed."""
    import argparse

    from servelab.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if action.option_strings and action.help != argparse.SUPPRESS:
                assert action.help, f"{name} {action.option_strings} has no help"
        shown = {s for a in sub._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
        hidden = {"--dp", "--tp", "--token-budget", "--slo-ttft-ms", "--capacity-ttft-p99-ms"}
        assert not hidden & shown, name
