"""Arguments shared by the subcommands that run a scheduler: limits, deployment, outputs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servelab.flag_types import add_hidden_alias
from servelab.slo_args import add_goodput_args
from sim.cost.roofline import KV_CACHE_DTYPES, QUANTIZATIONS
from sim.deployment import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DTYPE_NAMES,
    Deployment,
    DeploymentOptions,
)
from sim.engine.scheduler_config import (
    DEFAULT_POLICY,
    POLICIES,
    PREEMPTION_MODES,
    QUEUES,
    VLLM_POLICY,
    SchedulerConfig,
)
from sim.engine.speculation.config import SpeculativeConfig
from sim.pricing import COSTS, DEFAULT_COST
from sim.specs.engine_limits import ENGINE_DEFAULTS, EngineLimits
from workloads.formats.files import atomic_output


def add_scheduler_args(parser: argparse.ArgumentParser) -> None:
    """--max-num-seqs, --num-blocks, --block-size, --token-budget, --max-model-len."""
    group = parser.add_argument_group("scheduler")
    group.add_argument("--max-num-seqs", type=int, default=None,
                       help="most running requests (default: vLLM's for the GPU when --model "
                            f"or --hardware names a deployment, else "
                            f"{ENGINE_DEFAULTS.max_num_seqs})")
    group.add_argument("--num-blocks", type=int, default=None,
                       help="KV pool in blocks (default: GPU memory left after weights "
                            "when simulating, --kv-cache-gib on the executor)")
    group.add_argument("--block-size", type=int, default=ENGINE_DEFAULTS.block_size,
                       help="tokens per KV block")
    add_hidden_alias(group, "--token-budget", "token_budget", int)  # servelab's first name
    group.add_argument("--max-num-batched-tokens", dest="token_budget", type=int, default=None,
                       metavar="N",
                       help="most tokens per step (default: chunked's is vLLM's for the GPU "
                            "when --model or --hardware names a deployment, else "
                            f"{ENGINE_DEFAULTS.token_budget}; other policies max-model-len)")
    group.add_argument("--max-model-len", type=int, default=None,
                       help="prompt+output limit per request; longer requests are rejected "
                            "(default: the model's context; <= "
                            f"{ENGINE_DEFAULTS.max_model_len} unless --model or --hardware "
                            "names a deployment)")
    add_prefix_caching_arg(group)
    group.add_argument("--speculative-config", default=None, metavar="JSON",
                       help='speculative decoding, vLLM\'s JSON: {"method": "ngram", '
                            '"num_speculative_tokens": 4, "prompt_lookup_max": 4, '
                            '"prompt_lookup_min": 2}; simulation adds "acceptance_rates": '
                            '[per position] (default: off)')
    queue = parser.add_argument_group("queue order")
    queue.add_argument("--queue", default="fcfs", choices=QUEUES,
                       help="who is admitted first: fcfs (default), priority (lower value "
                            "first, may preempt lower priority), fair (VTC over tenants), sjf "
                            "(shortest predicted output first)")
    queue.add_argument("--queue-aging-s", type=float, default=None,
                       help="starvation bound: once a request has waited this long, no later "
                            "arrival is admitted before it (default 60 for priority and sjf; "
                            "none for fair, whose counters bound it)")
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
    add_goodput_args(parser)


def parse_policies(text: str) -> list[str]:
    """'a,b' -> ['a', 'b'], each a known policy, no repeats."""
    policies = [p.strip() for p in text.split(",")]
    if not all(policies):
        raise ValueError(f"--policies {text!r} has an empty item")
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if len(set(policies)) != len(policies):
        raise ValueError(f"--policies repeats a policy: {text}")
    return policies


def scheduler_config(args: argparse.Namespace, policy: str, num_blocks: int,
                     max_model_len: int,
                     blocks_in_gib: Callable[[float], int] | None = None,
                     server: dict[str, Any] | None = None,
                     limits: EngineLimits | None = None) -> SchedulerConfig:
    """The SchedulerConfig the flags describe (validated by SchedulerConfig itself);
    blocks_in_gib sizes --swap-space-gib in KV blocks of the deployment; `server`'s limits
    (a calibrated server's) replace the flags left at their defaults, then `limits` (the
    deployment's, ENGINE_DEFAULTS when None) fill the rest."""
    server = server or {}
    limits = limits or ENGINE_DEFAULTS

    def flag(key: str) -> Any:
        value = getattr(args, key)
        given = key not in SERVER_LIMIT_DEFAULTS or value != SERVER_LIMIT_DEFAULTS[key]
        return value if given or server.get(key) is None else server[key]

    # Unset limits: the calibrated server's, else the deployment's (vLLM's budget is chunked's;
    # a policy that prefills whole prompts keeps max_model_len as its budget).
    max_num_seqs = flag("max_num_seqs") or limits.max_num_seqs
    token_budget = flag("token_budget")
    if token_budget is None and policy == VLLM_POLICY and limits.vllm:
        token_budget = limits.token_budget

    swap = getattr(args, "preemption", "recompute") == "swap"
    if swap and blocks_in_gib is None:
        raise ValueError("--preemption swap is not available for this command")
    if swap and not args.swap_space_gib > 0:
        raise ValueError(f"--swap-space-gib must be > 0, got {args.swap_space_gib}")
    return SchedulerConfig(
        policy=policy,
        num_blocks=args.num_blocks if args.num_blocks is not None else num_blocks,
        block_size=flag("block_size"),
        max_num_seqs=max_num_seqs,
        max_model_len=args.max_model_len if args.max_model_len is not None else max_model_len,
        token_budget=token_budget,
        enable_prefix_caching=flag("enable_prefix_caching"),
        queue=args.queue,
        queue_aging_s=args.queue_aging_s,
        sjf_noise=args.sjf_noise,
        preemption=getattr(args, "preemption", "recompute"),
        swap_space_blocks=blocks_in_gib(args.swap_space_gib) if swap else 0,
        speculative=(SpeculativeConfig.from_json(args.speculative_config)
                     if getattr(args, "speculative_config", None) else None),
    )


def deployment_scheduler_config(args: argparse.Namespace, policy: str | None,
                                deployment: Deployment) -> SchedulerConfig:
    """scheduler_config on a deployment's KV pool, length and limits; `policy` None: the
    calibrated server's policy, else the deployment's default (default_policy)."""
    server = dict(deployment.server_limits)
    return scheduler_config(args, policy or server.get("policy") or default_policy(deployment),
                            deployment.kv_pool.num_blocks, deployment.max_model_len,
                            deployment.kv_pool.blocks_in_gib, server, deployment.engine_limits)


def default_policy(deployment: Deployment) -> str:
    """vLLM's (chunked prefill, always on in V1) where the deployment takes vLLM's limits,
    else the CPU lab's DEFAULT_POLICY."""
    return VLLM_POLICY if deployment.engine_limits.vllm else DEFAULT_POLICY


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
    """The deployment flags (servelab's names and vLLM's): what deployment_options reads."""
    group = parser.add_argument_group("deployment (analytic cost model; vLLM's flag names too)")
    group.add_argument("--model", default=None,
                       help="a preset, a Hugging Face id servelab ships a config for "
                            "(`servelab models`), or a config.json path or its folder (default "
                            f"{DeploymentOptions.model}). Naming --model or --hardware gives "
                            "every unset limit vLLM's default for that GPU and the chunked "
                            "policy, as `vllm serve` runs")
    group.add_argument("--hardware", default=None,
                       help="a GPU preset (`servelab hardware`) or a GPU file (default "
                            f"{DeploymentOptions.hardware})")
    add_parallel_args(group)


def add_parallel_args(group: argparse._ArgumentGroup, serve: bool = False) -> None:
    """--dtype, --tp, --data-parallel-size, --enable-expert-parallel,
    --gpu-memory-utilization, --cost-model (serve has its own --dtype)."""
    if not serve:
        group.add_argument("--dtype", default="bf16", choices=DTYPE_NAMES,
                           help="bf16 or fp16 (vLLM's auto, bfloat16, float16, half too)")
    group.add_argument("--quantization", "-q", default=None, choices=QUANTIZATIONS,
                       help="fp8: linear layers' weights in one byte, their GEMMs on FP8 "
                            "tensor cores where the GPU has them (vLLM's --quantization fp8)")
    add_kv_cache_dtype_arg(group)
    add_hidden_alias(group, "--tp", "tp", int)  # servelab's first name
    group.add_argument("--tensor-parallel-size", "-tp", dest="tp", type=int,
                       default=None if serve else 1,
                       help="tensor-parallel GPUs per engine (analytic model; default 1)")
    group.add_argument("--data-parallel-size", "-dp", dest="data_parallel_size", type=int,
                       default=1, help="data-parallel engines, each its own scheduler and KV "
                                       "pool; requests spread as vLLM's front end does")
    group.add_argument("--enable-expert-parallel", action="store_true",
                       help="an MoE model's experts sharded over tp x dp GPUs, hidden states "
                            "exchanged around each MoE layer (vLLM's expert parallel)")
    add_cost_arg(group)
    group.add_argument("--vllm-version", default=None,
                       help="the vLLM version whose measured kernels price steps (default: "
                            "the newest measured on the GPU)")
    group.add_argument("--gpu-memory-utilization", type=float,
                       default=DEFAULT_GPU_MEMORY_UTILIZATION,
                       help="fraction of each GPU's memory for weights, activations and KV "
                            "(default %(default)g, as vLLM's)")
    group.add_argument("--cost-model", type=Path, default=None,
                       help="a calibration JSON from `servelab calibrate` instead of the "
                            "analytic model (its KV pool and max length become the defaults; "
                            "one from `calibrate --url` sets every limit and the policy the "
                            "server runs, where flags are left at their defaults)")


def add_kv_cache_dtype_arg(group: argparse._ArgumentGroup) -> None:
    """--kv-cache-dtype, vLLM's flag and values."""
    group.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                       help="the KV cache's dtype: auto (default) is the checkpoint's own KV "
                            "scheme where its quantization_config names one, else --dtype; "
                            "fp8 (= fp8_e4m3 on NVIDIA) and fp8_e5m2 store K and V in one "
                            "byte, which sizes the pool and the attention's reads (vLLM's "
                            "--kv-cache-dtype)")


def deployment_options(args: argparse.Namespace, num_blocks: int | None = None,
                       **defaults: Any) -> DeploymentOptions:
    """The DeploymentOptions the flags give; `defaults` fill flags left unset (None)."""
    def value(key: str, flag: Any) -> Any:
        return defaults[key] if flag is None and key in defaults else flag

    # A deployment the user names runs as vLLM would run it; the bundled-trace default keeps
    # the lab's limits, so its committed results stay comparable.
    named = args.model is not None or args.hardware is not None
    return DeploymentOptions(
        model=value("model", args.model) or DeploymentOptions.model,
        hardware=value("hardware", args.hardware) or DeploymentOptions.hardware,
        vllm_defaults=named,
        dtype=value("dtype", args.dtype), tensor_parallel=value("tensor_parallel", args.tp),
        data_parallel=args.data_parallel_size, expert_parallel=args.enable_expert_parallel,
        block_size=args.block_size, gpu_memory_utilization=args.gpu_memory_utilization,
        num_blocks=num_blocks, cost_model=args.cost_model, cost=args.cost,
        quantization=args.quantization, vllm_version=args.vllm_version,
        kv_cache_dtype=args.kv_cache_dtype, **_profile_limits(args))


def _profile_limits(args: argparse.Namespace) -> dict[str, int]:
    """The token budget and sequence cap the KV reserve is profiled at, where the command
    takes one of each (a sweep's grid lists several: the defaults size its pool)."""
    limits = {}
    for flag, key in (("token_budget", "max_num_batched_tokens"), ("max_num_seqs", "max_num_seqs")):
        value = getattr(args, flag, None)
        if isinstance(value, int):
            if value < 1:  # named as the scheduler names it, before the reserve reads it
                raise ValueError(f"{flag} must be >= 1, got {value}")
            limits[key] = value
    return limits


# Scheduler flags whose defaults a calibration of a running server replaces by its limits.
SERVER_LIMIT_DEFAULTS = {"block_size": ENGINE_DEFAULTS.block_size,
                         "max_num_seqs": None, "token_budget": None,
                         "enable_prefix_caching": True, "policy": None}


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


def add_cost_arg(group: argparse._ArgumentGroup) -> None:
    """--cost: what prices a GPU deployment's steps (sim.pricing.COSTS)."""
    group.add_argument("--cost", default=DEFAULT_COST, choices=COSTS,
                       help="auto (default): vLLM's measured kernels where the GPU has "
                            "tables (docs/kernels.md), else the fitted model; gpu: the "
                            "operator model fitted on published GPU profiles; kernels: the "
                            "measured kernels or an error; roofline: the analytic roofline")
