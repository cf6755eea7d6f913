"""`servelab` entry point: one subparser per subcommand, errors as one line and exit 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from servelab import (
    cmd_bench_serve,
    cmd_calibrate,
    cmd_fidelity_gpu,
    cmd_hardware,
    cmd_plan,
    cmd_report,
    cmd_route,
    cmd_run,
    cmd_serve,
    cmd_simulate,
    cmd_sweep,
    cmd_trace,
    cmd_validate,
)

# Each subcommand module exposes register(subparsers); register() sets args.func.
COMMANDS = (
    cmd_trace, cmd_simulate, cmd_sweep, cmd_plan, cmd_run, cmd_calibrate, cmd_validate, cmd_report,
    cmd_serve, cmd_bench_serve, cmd_route, cmd_hardware, cmd_fidelity_gpu,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servelab",
        description="A lab for LLM serving schedulers: simulate, run and compare policies.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(subparsers)
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
