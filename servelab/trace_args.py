"""The trace arguments every trace-reading subcommand shares, and loading a trace from them."""

from __future__ import annotations

import argparse

import numpy as np

from workloads import BUNDLED, FORMATS, SPEC_HELP, Trace, TraceTransforms, open_trace
from workloads.formats.vllm_bench import is_vllm_spec
from workloads.synthetic.spec import is_synthetic_spec
from workloads.transforms import scale_qps, with_hash_block_tokens

TRACE_EPILOG = f"""\
TRACE is one of:
  a bundled trace      {", ".join(BUNDLED)}
  a trace file         Azure LLM inference CSV, Mooncake JSONL (also vLLM's timed
                       traces: give their block size with --hash-block-tokens),
                       servelab's own schema as .csv/.jsonl/.parquet, a `servelab
                       serve` request log (.sqlite), vLLM bench's ShareGPT .json or
                       an inference-perf config (.yml: its data and load.stages);
                       the format is detected from the content (force it with --format)
  a synthetic spec     see below
  a vllm: spec         vLLM bench's random or prefix_repetition dataset in its own
                       option names, e.g. vllm:dataset_name=random,num_prompts=500,
                       request_rate=4,random_input_len=1024,random_prefix_len=100

Transforms run in this order: --start-s/--end-s window (re-zeroed), --max-requests,
--qps-scale, --length-scale (with --prompt-scale/--output-scale on top),
--max-prompt-len/--max-output-len.
Arrival times must be non-decreasing; equal times are fine, a time that goes backwards
is an error naming its line.

{SPEC_HELP}"""


# --open-loop, as every simulating command spells it (sim.cluster.closed_loop runs the default).
OPEN_LOOP_HELP = ("replay every arrival time as written, sessions' turns included (default: a "
                  "session's turn waits for the previous answer plus its think time, as "
                  "bench-serve sends it)")


# The transform flags: (flag, type, default, metavar, help); TraceTransforms has the fields.
_TRANSFORM_FLAGS = (
    ("--start-s", float, 0.0, "S", "drop requests arriving before S seconds"),
    ("--end-s", float, None, "S", "drop requests arriving at or after S seconds"),
    ("--max-requests", int, None, "N", "keep the first N requests"),
    ("--qps-scale", float, 1.0, "X", "multiply the arrival rate by X (X > 1 compresses gaps)"),
    ("--length-scale", float, 1.0, "X", "multiply prompt and output lengths by X (rounded)"),
    ("--prompt-scale", float, 1.0, "X", "multiply prompt lengths by X as well"),
    ("--output-scale", float, 1.0, "X", "multiply output lengths by X as well"),
    ("--max-prompt-len", int, None, "N", "clip prompt lengths to N tokens"),
    ("--max-output-len", int, None, "N", "clip output lengths to N tokens"),
)


def add_trace_args(parser: argparse.ArgumentParser, positional: bool) -> None:
    """Add TRACE (positional, or --trace), --format, --seed and the transforms to `parser`."""
    group = parser.add_argument_group("trace")
    what = "bundled name, file or synthetic spec"
    if positional:
        group.add_argument("trace", metavar="TRACE", help=what)
    else:
        group.add_argument("--trace", metavar="TRACE", required=True, help=what)
    group.add_argument(
        "--format", choices=(*FORMATS, "inference-perf"),
        help="force the file format instead of detecting it",
    )
    group.add_argument(
        "--hash-block-tokens", type=int, metavar="N",
        help="prompt tokens each prefix hash id of the file covers (default: Mooncake's 512)",
    )
    group.add_argument(
        "--seed", type=int, default=0, help="random seed: synthetic traces and the run (default 0)"
    )
    for flag, kind, default, metavar, help_text in _TRANSFORM_FLAGS:
        group.add_argument(flag, type=kind, default=default, metavar=metavar, help=help_text)
    # Commands without add_rate_args replay at the trace's own rate (bench-serve has its own
    # --request-rate, vLLM's, applied after loading).
    parser.set_defaults(replay_rate=None, replay_burstiness=None)


def add_rate_args(parser: argparse.ArgumentParser) -> None:
    """--request-rate and --burstiness, as `vllm bench serve` spells them, for a replay."""
    group = parser.add_argument_group("arrival rate (instead of --qps-scale)")
    group.add_argument("--request-rate", dest="replay_rate", type=float, default=None,
                       metavar="R", help="send R requests per second: a trace file keeps the "
                       "shape of its arrivals, scaled to R; a generated workload (synthetic: "
                       "or vllm: spec) draws Poisson arrivals at R, as vLLM's benchmark does")
    group.add_argument("--burstiness", dest="replay_burstiness", type=float, default=None,
                       metavar="B", help="with --request-rate on a generated workload: the "
                       "gamma shape of the gaps (1 Poisson, default; below 1 burstier)")


def transforms_from_args(args: argparse.Namespace) -> TraceTransforms:
    """The transforms the parsed arguments ask for."""
    return TraceTransforms(
        start_s=args.start_s,
        end_s=args.end_s,
        max_requests=args.max_requests,
        qps_scale=args.qps_scale,
        length_scale=args.length_scale,
        prompt_scale=args.prompt_scale,
        output_scale=args.output_scale,
        max_prompt_len=args.max_prompt_len,
        max_output_len=args.max_output_len,
    )


def load_trace_from_args(args: argparse.Namespace) -> Trace:
    """Open the trace and apply the transforms, in the order TRACE_EPILOG documents, then
    --request-rate."""
    transforms = transforms_from_args(args)  # bad values fail before any file is read
    rate, burstiness = args.replay_rate, args.replay_burstiness
    generated = is_synthetic_spec(args.trace) or is_vllm_spec(args.trace)
    if rate is not None and args.qps_scale != 1.0:
        raise ValueError("give --request-rate or --qps-scale, not both")
    if burstiness is not None and (rate is None or not generated):
        raise ValueError("--burstiness shapes the arrivals --request-rate draws for a "
                         "generated workload (a synthetic: or vllm: spec)")
    trace = open_trace(args.trace, args.format, args.seed)
    if args.hash_block_tokens is not None:
        trace = with_hash_block_tokens(trace, args.hash_block_tokens)
    trace = transforms.apply(trace)
    if rate is None:
        return trace
    if generated:
        from servelab.bench.vllm_flags import vllm_schedule

        return vllm_schedule(trace, None, rate, burstiness or 1.0, args.seed)
    return at_rate(trace, rate)


def at_rate(trace: Trace, rate_rps: float) -> Trace:
    """The trace's arrivals scaled so that they average `rate_rps` requests a second."""
    if trace.span_s <= 0:
        raise ValueError(f"--request-rate: trace {trace.name} sends every request at once; "
                         "it has no rate to scale")
    # Mean rate as the trace's own arrivals give it: requests over the span they cover.
    own_rps = len(trace) / trace.span_s
    if not np.isfinite(rate_rps):
        raise ValueError("--request-rate must be finite for a trace file")
    return scale_qps(trace, rate_rps / own_rps)
