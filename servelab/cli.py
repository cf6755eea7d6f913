"""`servelab` entry point: one subparser per subcommand, errors as one line and exit 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from servelab.commands import (
    bench_serve,
    calibrate,
    fidelity_gpu,
    hardware,
    plan,
    report,
    route,
    run,
    serve,
    simulate,
    sweep,
    trace,
    validate,
)
from servelab.flag_types import OneLineParser, check_numeric_flags

# Each subcommand module exposes register(subparsers); register() sets args.func.
COMMANDS = (
    trace, simulate, sweep, plan, run, calibrate, validate, report, serve, bench_serve, route,
    hardware, fidelity_gpu,
)

# What the executor extra installs: a command that needs one of them says which extra is missing.
EXECUTOR_MODULES = ("torch", "safetensors", "ninja")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="servelab",
        description="A lab for LLM serving schedulers: simulate, run and compare policies.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(subparsers)
    check_numeric_flags(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0), or a bad flag (2) whose one line is printed
        return int(exit_.code or 0)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe fails here, in reach of the handler, not at exit
        return code
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as a shell tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's final flush has nowhere to fail
        return 141  # 128 + SIGPIPE
    except (ValueError, OSError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"servelab {args.command}: error: {message}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name not in EXECUTOR_MODULES:
            raise
        print(f"servelab {args.command}: error: the PyTorch executor is not installed (no "
              f"{exc.name}); install servelab[executor], or simulate with `servelab simulate` "
              "or `servelab serve --simulate`", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"servelab {args.command}: interrupted", file=sys.stderr)
        return 130
