"""Flags shared by the benchmarks that replay a trace on the executor: the trace, its
transforms, the model and the KV pool (a subset of the `servelab` command line's)."""

from __future__ import annotations

import argparse

from executor.loading import DEFAULT_KV_CACHE_GIB, LoadedModel, load
from sim.specs.engine_limits import ENGINE_DEFAULTS
from workloads import Trace, TraceTransforms, open_trace


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """--trace and its transforms, --model, --threads, --kv-cache-gib, --block-size, --seed."""
    parser.add_argument("--trace", required=True, help="bundled name, file or synthetic spec")
    for flag, kind, default in (("--max-requests", int, None), ("--qps-scale", float, 1.0),
                                ("--length-scale", float, 1.0), ("--prompt-scale", float, 1.0),
                                ("--output-scale", float, 1.0), ("--max-prompt-len", int, None),
                                ("--max-output-len", int, None)):
        parser.add_argument(flag, type=kind, default=default)
    parser.add_argument("--model", default="peer-45m", help="preset or checkpoint directory")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (pinned)")
    parser.add_argument("--kv-cache-gib", type=float, default=DEFAULT_KV_CACHE_GIB)
    parser.add_argument("--block-size", type=int, default=ENGINE_DEFAULTS.block_size)
    parser.add_argument("--seed", type=int, default=0)


def trace_from_args(args: argparse.Namespace) -> Trace:
    """The transformed trace the flags name."""
    transforms = TraceTransforms(
        max_requests=args.max_requests, qps_scale=args.qps_scale,
        length_scale=args.length_scale, prompt_scale=args.prompt_scale,
        output_scale=args.output_scale, max_prompt_len=args.max_prompt_len,
        max_output_len=args.max_output_len)
    return transforms.apply(open_trace(args.trace, None, args.seed))


def trace_and_model(args: argparse.Namespace) -> tuple[Trace, LoadedModel]:
    """The transformed trace and the loaded model the flags name."""
    return trace_from_args(args), load(args.model, threads=args.threads, seed=args.seed)
