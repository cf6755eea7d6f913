"""The trace arguments every trace-reading subcommand shares, and loading a trace from them."""

from __future__ import annotations

import argparse

from workloads import BUNDLED, FORMATS, SPEC_HELP, Trace, TraceTransforms, open_trace
from workloads.transforms import with_hash_block_tokens

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
    """Open the trace and apply the transforms, in the order TRACE_EPILOG documents."""
    transforms = transforms_from_args(args)  # bad values fail before any file is read
    trace = open_trace(args.trace, args.format, args.seed)
    if args.hash_block_tokens is not None:
        trace = with_hash_block_tokens(trace, args.hash_block_tokens)
    return transforms.apply(trace)
