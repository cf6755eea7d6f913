"""`servelab fidelity-gpu`: the fitted GPU cost model against Splitwise's steps and
LLMServingSim's real vLLM runs, as tables, charts and JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from servelab.calibration.gpu_replay import load_runs
from servelab.calibration.gpu_validation import (
    format_runs,
    format_splitwise,
    run_table,
    splitwise_errors,
    splitwise_table,
)
from servelab.reporting.gpu_fidelity import write_report
from sim.specs.hardware import hardware_spec


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("fidelity-gpu", help="validate the fitted GPU cost model")
    parser.add_argument("--out", type=Path, default=Path("reports/fidelity"),
                        help="directory for the charts and JSON (default reports/fidelity)")
    parser.add_argument("--gpu-file", type=Path, action="append", default=[], metavar="FILE",
                        help="a GPU file replacing the shipped GPU of its name in the vLLM "
                             "replays, e.g. with measured all-reduces (repeatable)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    errors = splitwise_errors()
    split_rows = splitwise_table(errors)
    print("Splitwise Llama-2-70B steps (never fitted on), signed error of predicted step time")
    print(format_splitwise(split_rows))
    files = {}
    gpus = sorted({run.gpu for run in load_runs()})
    for path in args.gpu_file:
        name = hardware_spec(str(path)).name  # a bad file's error names the file and field
        if name not in gpus:
            raise ValueError(f"--gpu-file {path}: GPU {name!r} runs none of the replays; "
                             f"name it one of {', '.join(gpus)}")
        files[name] = path
    run_rows = run_table(files)
    print("\nLLMServingSim's real vLLM runs, replayed (never fitted on)")
    print(format_runs(run_rows))
    for path in write_report(errors, split_rows, run_rows, args.out):
        print(f"wrote {path}")
    return 0
