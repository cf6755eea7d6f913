"""`servelab fidelity-gpu`: the GPU cost model against Splitwise's steps, LLMServingSim's
real vLLM runs and AIConfigurator's measured H100 vLLM runs, as tables, charts and JSON."""

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
from servelab.reporting.gpu_fidelity import write_report, write_silicon_report
from sim.measured.silicon import (
    error_table,
    format_error_table,
    format_refusals,
    simulate_rows,
)
from sim.measured.silicon_rows import HARDWARE, MEASURED_ROUNDS
from sim.specs.hardware import hardware_spec


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("fidelity-gpu", help="validate the fitted GPU cost model")
    parser.add_argument("--out", type=Path, default=Path("reports/fidelity"),
                        help="directory for the charts and JSON (default reports/fidelity)")
    parser.add_argument("--gpu-file", type=Path, action="append", default=[], metavar="FILE",
                        help="a GPU file replacing the shipped GPU of its name in the vLLM "
                             "replays, e.g. with measured all-reduces (repeatable)")
    parser.add_argument("--silicon-only", action="store_true",
                        help="replay only AIConfigurator's H100 vLLM runs")
    parser.add_argument("--silicon-rounds", type=int, default=MEASURED_ROUNDS, metavar="N",
                        help="measured requests per user in each AIConfigurator run "
                             f"(default {MEASURED_ROUNDS}, as measured; fewer is faster)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.silicon_rounds < 1:
        raise ValueError(f"--silicon-rounds must be >= 1, got {args.silicon_rounds}")
    files = _gpu_files(args.gpu_file)
    if not args.silicon_only:
        _llmservingsim_and_splitwise(files, args.out)
    results = simulate_rows(rounds=args.silicon_rounds,
                            hardware=str(files.get(HARDWARE, HARDWARE)))
    print("\nAIConfigurator's H100 vLLM runs, replayed (never fitted on); signed median and "
          "p90 |error| of mean TTFT and TPOT")
    print(format_error_table(error_table(results)))
    if any(not r.simulated for r in results):
        print(format_refusals(results))
    for path in write_silicon_report(results, args.out):
        print(f"wrote {path}")
    return 0


def _gpu_files(paths: list[Path]) -> dict[str, Path]:
    """GPU files by the preset name they replace; a name no replay runs is an error."""
    gpus = sorted({run.gpu for run in load_runs()} | {HARDWARE})
    files = {}
    for path in paths:
        name = hardware_spec(str(path)).name  # a bad file's error names the file and field
        if name not in gpus:
            raise ValueError(f"--gpu-file {path}: GPU {name!r} runs none of the replays; "
                             f"name it one of {', '.join(gpus)}")
        files[name] = path
    return files


def _llmservingsim_and_splitwise(files: dict[str, Path], out: Path) -> None:
    errors = splitwise_errors()
    split_rows = splitwise_table(errors)
    print("Splitwise Llama-2-70B steps (never fitted on), signed error of predicted step time")
    print(format_splitwise(split_rows))
    run_rows = run_table(files)
    print("\nLLMServingSim's real vLLM runs, replayed (never fitted on)")
    print(format_runs(run_rows))
    for path in write_report(errors, split_rows, run_rows, out):
        print(f"wrote {path}")
