"""`servelab bench-serve`: replay a trace against a running server, measured client-side."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from tqdm import tqdm

from servelab.bench_capacity import run_capacity
from servelab.capacity_args import add_capacity_args, capacity_options
from servelab.sim_args import format_summaries, slo_from_args, write_json_atomic
from servelab.trace_args import TRACE_EPILOG, add_trace_args, load_trace_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `bench-serve` subcommand."""
    parser = subparsers.add_parser(
        "bench-serve", help="replay a trace against an OpenAI-compatible server",
        description="Send each trace request at its arrival time (synthetic token-id prompts "
        "of the trace's length, max_tokens = output length, EOS ignored, streamed) and report "
        "TTFT, ITL, TPOT and E2EL as measured by the client, in simulate's summary keys. "
        "A request without a complete answer is counted as failed (the first errors are "
        "listed), never retried once the server may have started it; one whose first try "
        "never reached the server (no connection, or a pooled one the server had closed) is "
        "sent once more on a new connection. Turns of a session (the trace's session_id, turn "
        "and think_s) wait for the previous turn's answer plus its think time and carry the "
        "conversation: the previous prompt, the tokens actually generated, the new question. "
        "Requests that share prefix segments send identical leading tokens.",
        epilog=TRACE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_trace_args(parser, positional=False)
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="model id (default: the server's first)")
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="most requests in flight (default: no limit)")
    parser.add_argument("--users", type=int, default=None,
                        help="closed loop: N users, each sending its next request (or "
                             "session) as soon as its last one finished, instead of the "
                             "trace's arrival times")
    parser.add_argument("--timeout-s", type=float, default=3600.0,
                        help="stop the run after this long; unfinished requests fail")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="prompt token ids are drawn below this (default: the server's)")
    parser.add_argument("--json", type=Path, default=None, help="write the result as JSON")
    parser.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput TTFT bound")
    parser.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput TPOT bound")
    add_capacity_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the trace, replay it, print the summary and write --json."""
    from servelab.bench.client import BenchConfig, replay_trace, summarize_bench

    config = BenchConfig(args.url, args.model, args.api_key, args.max_concurrency,
                         args.timeout_s)
    if args.vocab_size is not None and args.vocab_size < 4:
        raise ValueError(f"--vocab-size must be >= 4, got {args.vocab_size}")
    if args.users is not None and args.users < 1:
        raise ValueError(f"--users must be >= 1, got {args.users}")
    trace = load_trace_from_args(args)
    if args.find_capacity:
        if args.users is not None:
            raise ValueError("--find-capacity raises the rate; it does not combine with --users")
        return run_capacity(capacity_options(args), trace, config)
    slo = slo_from_args(args)
    with tqdm(total=len(trace), unit="req", file=sys.stderr, leave=False, disable=None) as bar:
        model, vocab, result = asyncio.run(replay_trace(trace, config, args.vocab_size,
                                                        args.seed, lambda: bar.update(1),
                                                        args.users))
    summary = summarize_bench(result, slo)
    print(f"trace {trace.name}: {len(trace)} requests over {trace.span_s:.1f} s against "
          f"{args.url} ({model})")
    print(format_summaries({"server": summary}))
    print(f"{summary['failed']} of {len(trace)} requests failed, {summary['rejected']} were "
          f"rejected; {result.retried} sent again on a new connection after a first try that "
          "never reached the server")
    for error in result.errors[:5]:
        print(f"  error: {error}")
    if args.json is not None:
        write_json_atomic(args.json, {
            "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
            "config": {"url": args.url, "model": model, "vocab_size": vocab, "seed": args.seed,
                       "max_concurrency": args.max_concurrency, "users": args.users,
                       "timeout_s": args.timeout_s,
                       "slo": None if slo is None else {"ttft_ms": slo.ttft_ms,
                                                        "tpot_ms": slo.tpot_ms}},
            "results": {"server": summary},
        })
    return 0
