"""`servelab trace`: summarize a trace, optionally save it converted and its summary as JSON."""

from __future__ import annotations

import argparse
import json

from servelab.trace_args import TRACE_EPILOG, add_trace_args, load_trace_from_args
from sim.specs.engine_limits import ENGINE_DEFAULTS
from workloads import format_summary, save_trace, summarize
from workloads.formats.files import atomic_output
from workloads.formats.writers import output_format


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `trace` subcommand."""
    parser = subparsers.add_parser(
        "trace",
        help="summarize a trace; convert or save it",
        description="Print a trace's statistics (after any transforms), with a line per "
        "tenant and per priority when the trace has them; optionally save the transformed "
        "trace and the statistics.",
        epilog=TRACE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_trace_args(parser, positional=True)
    parser.add_argument("--json", metavar="PATH", help="write the statistics as JSON")
    parser.add_argument(
        "--save",
        metavar="PATH",
        help="save the trace in servelab's schema (.csv, .jsonl or .parquet)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load, summarize, print; then write --save and --json (each atomically)."""
    if args.save:
        output_format(args.save)  # a bad suffix fails before any work
    trace = load_trace_from_args(args)
    summary = summarize(trace, ENGINE_DEFAULTS.block_size)
    print(format_summary(summary))
    if args.save:
        save_trace(trace, args.save)
    if args.json:
        with atomic_output(args.json) as temp:
            temp.write_text(json.dumps({"trace": summary.to_dict()}, indent=2) + "\n")
    return 0
