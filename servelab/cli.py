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
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"servelab {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"servelab {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as a shell tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's final flush has nowhere to fail
        return 141  # 128 + SIGPIPE
