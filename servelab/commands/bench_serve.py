"""`servelab bench-serve`: replay a trace against a running server, measured client-side."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from datetime import datetime
from pathlib import Path

from tqdm import tqdm

from servelab.bench.vllm_flags import (
    DEFAULT_METRIC_PERCENTILES,
    DEFAULT_PERCENTILE_METRICS,
    parse_goodput,
    parse_metric_percentiles,
    parse_percentile_metrics,
    vllm_schedule,
)
from servelab.bench.vllm_result import (
    VllmReport,
    format_vllm_result,
    result_filename,
    saved_result,
    vllm_metrics,
)
from servelab.bench_capacity import run_capacity
from servelab.capacity_args import add_capacity_args, capacity_options
from servelab.sim_args import format_summaries, write_json_atomic
from servelab.slo_args import slo_from_args
from servelab.trace_args import TRACE_EPILOG, add_trace_args, load_trace_from_args
from sim.engine.core import Request
from sim.replay.metrics import Slo
from workloads.trace import Trace

DEFAULT_URL = "http://127.0.0.1:8000"  # vLLM's --host and --port defaults


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
    parser.add_argument("--url", "--base-url", dest="url", default=DEFAULT_URL,
                        help=f"server base URL (default {DEFAULT_URL}, as vLLM's)")
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
    # The old goodput spellings; --goodput (vLLM's) is the one shown.
    parser.add_argument("--slo-ttft-ms", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--slo-tpot-ms", type=float, default=None, help=argparse.SUPPRESS)
    add_capacity_args(parser)
    _add_vllm_args(parser)
    parser.set_defaults(func=run)


def _add_vllm_args(parser: argparse.ArgumentParser) -> None:
    """`vllm bench serve`'s flags, with its meanings."""
    group = parser.add_argument_group("as `vllm bench serve`")
    group.add_argument("--num-prompts", type=int, default=None,
                       help="send the trace's first N requests (default: all)")
    group.add_argument("--request-rate", type=float, default=None,
                       help="requests per second, sent as vLLM draws them (inf: all at "
                            "once; default: the trace's own arrival times)")
    group.add_argument("--burstiness", type=float, default=1.0,
                       help="with --request-rate: gamma-interval shape; 1 is Poisson, "
                            "below 1 burstier, above 1 more even (default 1)")
    group.add_argument("--goodput", nargs="+", default=None, metavar="KEY:VALUE",
                       help="SLOs in ms for request goodput, e.g. ttft:200 tpot:50 "
                            "(keys ttft, tpot, e2el)")
    group.add_argument("--percentile-metrics", default=DEFAULT_PERCENTILE_METRICS,
                       help=f"metrics whose percentiles are reported (default "
                            f"{DEFAULT_PERCENTILE_METRICS}; also e2el)")
    group.add_argument("--metric-percentiles", default=DEFAULT_METRIC_PERCENTILES,
                       help=f"percentiles reported, e.g. 50,90,99 (default "
                            f"{DEFAULT_METRIC_PERCENTILES})")
    group.add_argument("--save-result", action="store_true",
                       help="write vLLM's result JSON (its keys, and ours under 'servelab')")
    group.add_argument("--result-dir", type=Path, default=Path("."),
                       help="where --save-result writes (default: here)")
    group.add_argument("--result-filename", default=None,
                       help="--save-result's file name (default: vLLM's "
                            "<label>-<rate>qps[-concurrency<N>]-<model>-<date>.json)")


def run(args: argparse.Namespace) -> int:
    """Load the trace, replay it, print the summary and write --json (and --save-result)."""
    from servelab.bench.client import BenchConfig, replay_trace, summarize_bench

    config = BenchConfig(args.url, args.model, args.api_key, args.max_concurrency,
                         args.timeout_s)
    if args.vocab_size is not None and args.vocab_size < 4:
        raise ValueError(f"--vocab-size must be >= 4, got {args.vocab_size}")
    if args.users is not None and args.users < 1:
        raise ValueError(f"--users must be >= 1, got {args.users}")
    report = _vllm_report(args)
    trace = vllm_schedule(load_trace_from_args(args), args.num_prompts, args.request_rate,
                          args.burstiness, args.seed)
    if args.find_capacity:
        if args.users is not None:
            raise ValueError("--find-capacity raises the rate; it does not combine with --users")
        return run_capacity(capacity_options(args), trace, config)
    slo = _slo(args, report)
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
    payload = {
        "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
        "config": {"url": args.url, "model": model, "vocab_size": vocab, "seed": args.seed,
                   "max_concurrency": args.max_concurrency, "users": args.users,
                   "timeout_s": args.timeout_s,
                   "slo": None if slo is None else {"ttft_ms": slo.ttft_ms,
                                                    "tpot_ms": slo.tpot_ms}},
        "results": {"server": summary},
    }
    if args.json is not None:
        write_json_atomic(args.json, payload)
    print_vllm_result(args, report, trace, model, result.requests, payload)
    return 0


def _vllm_report(args: argparse.Namespace) -> VllmReport:
    goodput = parse_goodput(args.goodput) if args.goodput else {}
    if goodput and (args.slo_ttft_ms is not None or args.slo_tpot_ms is not None):
        raise ValueError("--goodput and --slo-ttft-ms / --slo-tpot-ms both set SLOs; give one")
    return VllmReport(parse_percentile_metrics(args.percentile_metrics),
                      parse_metric_percentiles(args.metric_percentiles),
                      tuple(goodput.items()))


def _slo(args: argparse.Namespace, report: VllmReport) -> Slo | None:
    """The summary's goodput bounds: --slo-*, else --goodput's TTFT and TPOT (the summary
    has no E2EL bound; vLLM's request_goodput has every --goodput bound)."""
    goodput = dict(report.goodput_ms)
    if not goodput:
        return slo_from_args(args)
    if goodput.get("ttft") is None and goodput.get("tpot") is None:
        return None  # an E2EL bound only: vLLM's request_goodput counts it
    return Slo(goodput.get("ttft"), goodput.get("tpot"))


def print_vllm_result(args: argparse.Namespace, report: VllmReport, trace: Trace, model: str,
                      requests: list[Request], ours: dict) -> None:
    """Print vLLM's result block; with --save-result, write its JSON."""
    summary = ours["results"]["server"]
    metrics = vllm_metrics(requests, summary, report)
    print(format_vllm_result(metrics, report, args.max_concurrency, args.request_rate))
    if not args.save_result:
        return
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    rate = args.request_rate if args.request_rate is not None else _trace_rate(trace)
    rate_key = "inf" if math.isinf(rate) else rate
    header = {"date": date, "endpoint_type": "openai", "label": "servelab",
              "model_id": model, "tokenizer_id": model, "num_prompts": len(trace),
              "request_rate": rate_key, "burstiness": args.burstiness,
              "max_concurrency": args.max_concurrency}
    name = args.result_filename or result_filename("servelab", rate, args.max_concurrency,
                                                   model, date)
    path = args.result_dir / name
    write_json_atomic(path, saved_result(metrics, header, ours))
    print(f"result saved to {path}")


def _trace_rate(trace: Trace) -> float:
    """The mean rate the trace's own arrival times send (inf when all arrive at once)."""
    return len(trace) / trace.span_s if trace.span_s > 0 else math.inf
