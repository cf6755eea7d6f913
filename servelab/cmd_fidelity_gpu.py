"""`servelab fidelity-gpu`: the fitted GPU cost model against Splitwise's steps and
LLMServingSim's real vLLM runs, as tables, charts and JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from calibration.gpu_validation import (
    format_runs,
    format_splitwise,
    run_table,
    splitwise_errors,
    splitwise_table,
)
from reporting.gpu_fidelity import write_report


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("fidelity-gpu", help="validate the fitted GPU cost model")
    parser.add_argument("--out", type=Path, default=Path("reports/fidelity"),
                        help="directory for the charts and JSON (default reports/fidelity)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    errors = splitwise_errors()
    split_rows = splitwise_table(errors)
    print("Splitwise Llama-2-70B steps (never fitted on), signed error of predicted step time")
    print(format_splitwise(split_rows))
    run_rows = run_table()
    print("\nLLMServingSim's real vLLM runs, replayed (never fitted on)")
    print(format_runs(run_rows))
    for path in write_report(errors, split_rows, run_rows, args.out):
        print(f"wrote {path}")
    return 0
