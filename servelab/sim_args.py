"""Arguments shared by the subcommands that run a scheduler: limits, deployment, outputs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from sim.calibrated import CalibratedCostModel
from sim.core import Backend
from sim.cost_model import AnalyticCostModel
from sim.gpu_cost import coverage as gpu_coverage
from sim.gpu_cost import gpu_cost_backend
from sim.metrics import Slo
from sim.scheduler import POLICIES, SchedulerConfig
from sim.scheduler_config import PREEMPTION_MODES, QUEUES
from workloads.files import atomic_output

DEFAULT_MAX_MODEL_LEN = 8192


def add_scheduler_args(parser: argparse.ArgumentParser) -> None:
    """--max-num-seqs, --num-blocks, --block-size, --token-budget, --max-model-len."""
    group = parser.add_argument_group("scheduler")
    group.add_argument("--max-num-seqs", type=int, default=256, help="most running requests")
    group.add_argument("--num-blocks", type=int, default=None,
                       help="KV pool in blocks (default: GPU memory left after weights "
                            "when simulating, --kv-cache-gib on the executor)")
    group.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    group.add_argument("--token-budget", type=int, default=None,
                       help="most tokens per step (default: 2048 chunked, else max-model-len)")
    group.add_argument("--max-model-len", type=int, default=None,
                       help="prompt+output limit per request (default: the model's, <= 8192)")
    add_prefix_caching_arg(group)
    queue = parser.add_argument_group("queue order")
    queue.add_argument("--queue", default="fcfs", choices=QUEUES,
                       help="who is admitted first: fcfs (default), priority (lower value "
                            "first, may preempt lower priority), fair (VTC over tenants), sjf "
                            "(shortest predicted output first)")
    queue.add_argument("--queue-aging-s", type=float, default=SchedulerConfig.queue_aging_s,
                       help="starvation bound: once a request has waited this long, no later "
                            "arrival is admitted before it (default %(default)g)")
    queue.add_argument("--sjf-noise", type=float, default=0.0,
                       help="sjf's prediction error: log-space std of predicted/true output "
                            "length (default 0: an oracle)")
    group.add_argument("--preemption", default="recompute", choices=PREEMPTION_MODES,
                       help="an evicted request's KV: dropped and recomputed (default), or "
                            "swapped to host memory and back")
    group.add_argument("--swap-space-gib", type=float, default=4.0,
                       help="host memory for swapped KV with --preemption swap (default 4, "
                            "as vLLM's swap_space)")


def add_prefix_caching_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--enable-prefix-caching / --no-enable-prefix-caching, as vLLM spells them."""
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=True, help="share KV blocks of equal prompt prefixes "
                                           "(default: on)")


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """--json, --out and the goodput SLOs."""
    parser.add_argument("--json", type=Path, default=None, help="write the result as JSON")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for per-request/per-step tables and charts")
    parser.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput TTFT bound")
    parser.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput TPOT bound")


def parse_policies(text: str) -> list[str]:
    """'a,b' -> ['a', 'b'], each a known policy, no repeats."""
    policies = [p.strip() for p in text.split(",") if p.strip()]
    if not policies:
        raise ValueError("--policies is empty")
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if len(set(policies)) != len(policies):
        raise ValueError(f"--policies repeats a policy: {text}")
    return policies


def scheduler_config(args: argparse.Namespace, policy: str, num_blocks: int,
                     max_model_len: int,
                     blocks_in_gib: Callable[[float], int] | None = None) -> SchedulerConfig:
    """The SchedulerConfig the flags describe (validated by SchedulerConfig itself);
    blocks_in_gib sizes --swap-space-gib in KV blocks of the deployment."""
    swap = getattr(args, "preemption", "recompute") == "swap"
    if swap and blocks_in_gib is None:
        raise ValueError("--preemption swap is not available for this command")
    if swap and not args.swap_space_gib > 0:
        raise ValueError(f"--swap-space-gib must be > 0, got {args.swap_space_gib}")
    return SchedulerConfig(
        policy=policy,
        num_blocks=args.num_blocks if args.num_blocks is not None else num_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len if args.max_model_len is not None else max_model_len,
        token_budget=args.token_budget,
        enable_prefix_caching=args.enable_prefix_caching,
        queue=args.queue,
        queue_aging_s=args.queue_aging_s,
        sjf_noise=args.sjf_noise,
        preemption=getattr(args, "preemption", "recompute"),
        swap_space_blocks=blocks_in_gib(args.swap_space_gib) if swap else 0,
    )


def slo_from_args(args: argparse.Namespace) -> Slo | None:
    if args.slo_ttft_ms is None and args.slo_tpot_ms is None:
        return None
    return Slo(args.slo_ttft_ms, args.slo_tpot_ms)


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write JSON through a temporary file so a failure never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as temp:
        temp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


SUMMARY_ROWS = (
    ("completed", "{:d}"), ("rejected", "{:d}"), ("failed", "{:d}"),
    ("duration_s", "{:.1f}"), ("request_throughput", "{:.2f}"),
    ("output_throughput", "{:.1f}"), ("total_token_throughput", "{:.1f}"),
    ("median_ttft_ms", "{:.1f}"), ("p95_ttft_ms", "{:.1f}"), ("p99_ttft_ms", "{:.1f}"),
    ("median_tpot_ms", "{:.2f}"), ("median_itl_ms", "{:.2f}"), ("p99_itl_ms", "{:.2f}"),
    ("median_e2el_ms", "{:.1f}"), ("p99_e2el_ms", "{:.1f}"), ("goodput", "{:.2f}"),
    ("preemptions", "{:d}"), ("mean_batch_size", "{:.1f}"), ("max_batch_size", "{:d}"),
    ("mean_kv_usage", "{:.1%}"), ("slot_utilization", "{:.1%}"),
    ("prefix_cache_hit_rate", "{:.1%}"),
)


def format_summaries(results: dict[str, dict]) -> str:
    """A human table: one column per policy, one row per summary key."""
    names = list(results)
    width = max(12, *(len(n) for n in names))
    lines = [f"{'metric':<24}" + "".join(f"{n:>{width + 2}}" for n in names)]
    for key, fmt in SUMMARY_ROWS:
        if not any(key in r for r in results.values()):
            continue
        cells = []
        for name in names:
            value = results[name].get(key)
            cells.append("-" if value is None else fmt.format(value))
        lines.append(f"{key:<24}" + "".join(f"{c:>{width + 2}}" for c in cells))
    return "\n".join(lines)


def add_cost_model_args(parser: argparse.ArgumentParser) -> None:
    """--model, --hardware, --dtype, --cost-model: what deployment_backend reads."""
    group = parser.add_argument_group("deployment (analytic cost model)")
    group.add_argument("--model", default="llama-3-8b", help="model shape preset")
    group.add_argument("--hardware", default="h100", help="GPU preset: a100-80gb, h100, h200")
    group.add_argument("--dtype", default="bf16", help="bf16 or fp16")
    group.add_argument("--tp", type=int, default=1,
                       help="tensor-parallel GPUs per engine (analytic model; default 1)")
    group.add_argument("--cost", default="gpu", choices=("gpu", "roofline"),
                       help="gpu: the operator model fitted on published GPU profiles "
                            "(default); roofline: the analytic roofline")
    group.add_argument("--cost-model", type=Path, default=None,
                       help="a calibration JSON from `servelab calibrate` instead of the "
                            "analytic model (its KV pool and max length become the defaults; "
                            "one from `calibrate --url` sets every limit and the policy the "
                            "server runs, where flags are left at their defaults)")


# Scheduler flags whose defaults a calibration of a running server replaces by its limits.
SERVER_LIMIT_DEFAULTS = {"block_size": 16, "max_num_seqs": 256, "token_budget": None,
                         "enable_prefix_caching": True, "policy": None}


def use_server_limits(args: argparse.Namespace, server: dict) -> None:
    """Flags left at their defaults take the calibrated server's limits (`meta.server` of a
    calibration from `calibrate --url`), so a simulation runs as that server is set up."""
    for key, default in SERVER_LIMIT_DEFAULTS.items():
        known = hasattr(args, key) and server.get(key) is not None
        if known and getattr(args, key) == default:
            setattr(args, key, server[key])


def cost_model_name(args: argparse.Namespace) -> str:
    """Which cost model prices the run: calibrated, gpu-fitted or roofline."""
    if args.cost_model is not None:
        return "calibrated"
    return "gpu-fitted" if getattr(args, "cost", "gpu") == "gpu" else "roofline"


def deployment_backend(args: argparse.Namespace) -> tuple[Backend, int, int, str]:
    """The cost model, its default KV blocks and max length, and a one-line description."""
    if args.cost_model is not None:
        if getattr(args, "tp", 1) != 1:
            raise ValueError("--tp prices the analytic model; a calibration is measured as is")
        model = CalibratedCostModel.load(args.cost_model)
        meta = model.meta
        if meta.get("server"):
            use_server_limits(args, meta["server"])
        if meta.get("block_size", args.block_size) != args.block_size:
            raise ValueError(f"{args.cost_model}: calibrated with block size "
                             f"{meta['block_size']}, --block-size is {args.block_size}")
        where = f"calibrated {meta.get('model', '?')} on {meta.get('hardware', '?')}"
        return model, meta.get("num_blocks", 4096), meta.get("max_model_len", 2048), where
    tp = getattr(args, "tp", 1)
    model = AnalyticCostModel.preset(args.model, args.hardware, args.dtype, tensor_parallel=tp)
    max_len = min(model.model.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
    gpus = f"{tp}x {args.hardware}" if tp > 1 else args.hardware
    where = f"{args.model} on {gpus} ({args.dtype})"
    blocks = model.kv_pool_blocks(args.block_size)
    if getattr(args, "cost", "gpu") == "roofline":
        return model, blocks, max_len, where + "; priced by roofline"
    fitted = gpu_cost_backend(model.model, model.hardware, tp)
    budget = getattr(args, "token_budget", None) or max_len
    note = gpu_coverage(model.model.name, model.hardware.name, budget)
    return fitted, blocks, max_len, where + f"; priced by gpu-fitted: {note}"


CLASS_COLUMNS = ("requests", "completed", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
                 "p99_itl_ms", "served_tokens")


def format_classes(results: dict[str, dict]) -> str:
    """Per-tenant and per-priority tables of every run that has them ('' when none has)."""
    blocks = []
    for name, summary in results.items():
        for kind in ("tenants", "priorities"):
            rows = summary.get(kind)
            if not rows:
                continue
            header = f"{name}, per {kind[:-3] + 'y' if kind == 'priorities' else 'tenant'}"
            if kind == "tenants":
                header += f" (Jain's fairness index {summary['jain_fairness_index']:.3f})"
            lines = [header, f"{'':<12}" + "".join(f"{c:>16}" for c in CLASS_COLUMNS)]
            for key, row in rows.items():
                cells = ["-" if row[c] is None else f"{row[c]:.1f}" if c.endswith("_ms")
                         else f"{row[c]:.0f}" for c in CLASS_COLUMNS]
                lines.append(f"{key:<12}" + "".join(f"{c:>16}" for c in cells))
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
