"""`servelab plan`: the cheapest deployments that hold a p99 TTFT and ITL SLO on a trace."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from servelab.cluster_args import parse_pd
from servelab.flag_types import add_hidden_alias
from servelab.sim_args import (
    add_cost_arg,
    add_kv_cache_dtype_arg,
    add_prefix_caching_arg,
    write_json_atomic,
)
from servelab.slo_args import add_slo_p99_args
from servelab.sweeps.deployment_search import (
    DeploymentProbe,
    Family,
    SearchContext,
    cheapest,
    fitting_families,
    run_probe,
    simulate_args,
    smallest_scales,
)
from servelab.sweeps.grid import CapacitySlo, find_capacity
from servelab.sweeps.plan_report import (
    cost_name,
    engines_per_hardware,
    mark_unsearched,
    print_engines,
    print_plan,
    print_pricing,
    write_plan_out,
)
from servelab.sweeps.runners import LocalRunner, RayRunner
from servelab.trace_args import OPEN_LOOP_HELP, add_rate_args, add_trace_args, load_trace_from_args
from sim.cluster.config import DEFAULT_KV_LINK_GBPS
from sim.cluster.router import ROUTERS
from sim.cost.roofline import QUANTIZATIONS
from sim.deployment import DEFAULT_GPU_MEMORY_UTILIZATION, DTYPE_NAMES
from sim.engine.speculation.config import SpeculativeConfig
from sim.specs.engine_limits import (
    ENGINE_DEFAULTS,
    VLLM_LARGE_GPU_BYTES,
    VLLM_LARGE_GPU_SEQS,
    VLLM_LARGE_GPU_TOKENS,
)
from sim.specs.hardware import HARDWARE_SPECS, hardware_spec
from sim.specs.model_config import resolve_model


def register(subparsers: argparse._SubParsersAction) -> None:
    plan = subparsers.add_parser(
        "plan", help="cheapest deployments (GPUs, TP, replicas, P/D, router) holding an SLO",
        description=__doc__.splitlines()[0])
    add_trace_args(plan, positional=False)
    add_rate_args(plan)
    plan.add_argument("--open-loop", action="store_true", help=OPEN_LOOP_HELP)
    slo = plan.add_argument_group("SLO")
    add_slo_p99_args(slo, CapacitySlo.ttft_p99_ms, CapacitySlo.itl_p99_ms,
                     "every deployment listed holds it")
    _add_space_args(plan)
    _add_fixed_and_output_args(plan)
    plan.set_defaults(func=_run)


def _add_space_args(plan: argparse.ArgumentParser) -> None:
    """What the search varies: model, GPUs, parallelism, routers, P/D, limits."""
    space = plan.add_argument_group("search space (comma-separated lists)")
    space.add_argument("--model", default="llama-3-8b",
                       help="a preset, a shipped Hugging Face id, or a config.json path")
    space.add_argument("--dtype", default="bf16", choices=DTYPE_NAMES,
                       help="weights and activations: bf16 (default) or fp16")
    space.add_argument("--quantization", "-q", default=None, choices=QUANTIZATIONS,
                       help="fp8: every deployment's linear weights in one byte (vLLM's "
                            "--quantization fp8)")
    add_kv_cache_dtype_arg(space)
    space.add_argument("--speculative-config", default=None, metavar="JSON",
                       help='speculative decoding on every engine, vLLM\'s JSON with '
                            '"acceptance_rates" (as simulate takes it; default: off)')
    add_cost_arg(space)
    space.add_argument("--hardware", default=",".join(HARDWARE_SPECS),
                       help="GPU presets or files (default: every shipped GPU)")
    add_hidden_alias(space, "--tp", "tp")  # servelab's first names
    add_hidden_alias(space, "--dp", "dp")
    space.add_argument("--tensor-parallel-size", "-tp", dest="tp", default="1,2,4,8",
                       help="tensor-parallel degrees")
    space.add_argument("--data-parallel-size", "-dp", dest="dp", default=None,
                       help="data-parallel degrees, experts sharded over them (vLLM's "
                            "--enable-expert-parallel); default 1,2,4 for an MoE model, "
                            "else 1")
    space.add_argument("--routers", default="least-requests", help=", ".join(ROUTERS))
    space.add_argument("--pd-ratios", default="1:1,1:3",
                       help="prefill:decode ratios tried besides co-located ('' for none)")
    space.add_argument("--policies", default="chunked",
                       help="batching policies (default chunked, as vLLM runs)")
    space.add_argument("--max-num-seqs", default=None,
                       help="most running requests per engine (default: vLLM's for each GPU, "
                            f"{VLLM_LARGE_GPU_SEQS} on GPUs of {VLLM_LARGE_GPU_BYTES // 2**30} "
                            f"GiB or more, A100s aside, else {ENGINE_DEFAULTS.max_num_seqs})")
    space.add_argument("--token-budgets", "--max-num-batched-tokens", dest="token_budgets",
                       default=None, help="per-step token budgets (default: vLLM's for each "
                       f"GPU, {VLLM_LARGE_GPU_TOKENS} on those GPUs, else "
                       f"{ENGINE_DEFAULTS.token_budget})")
    space.add_argument("--max-engines", type=int, default=64, help="most engines per deployment")
    space.add_argument("--gpu-prices", default="",
                       help="$ per GPU-hour overrides, e.g. h100=2.5,h200=3.4")


def _add_fixed_and_output_args(plan: argparse.ArgumentParser) -> None:
    """What every probe shares, and where the answer goes."""
    fixed = plan.add_argument_group("fixed")
    fixed.add_argument("--block-size", type=int, default=ENGINE_DEFAULTS.block_size,
                       help="tokens per KV block (default %(default)s)")
    fixed.add_argument("--max-model-len", type=int, default=None,
                       help="prompt+output limit per request (default: the model's, capped)")
    fixed.add_argument("--kv-link-gbps", type=float, default=DEFAULT_KV_LINK_GBPS,
                       help="each prefill engine's KV link under P/D, Gb/s (default "
                            "%(default)g)")
    fixed.add_argument("--gpu-memory-utilization", type=float,
                       default=DEFAULT_GPU_MEMORY_UTILIZATION,
                       help="fraction of each GPU for weights, activations and KV (vLLM's)")
    add_prefix_caching_arg(fixed)
    out = plan.add_argument_group("output and where")
    out.add_argument("--top", type=int, default=5, help="cheapest deployments listed")
    out.add_argument("--rate-range", default="1,16",
                     help="qps scales to search the cheapest per GPU's highest rate in")
    out.add_argument("--json", type=Path, default=None, help="write the result as JSON")
    out.add_argument("--out", type=Path, default=None, help="tables and the chart")
    out.add_argument("--exhaustive", action="store_true",
                     help="run every probe to its end and prune no deployment (the same "
                          "answers, slower)")
    out.add_argument("--workers", type=int, default=None,
                     help="processes (default: one per core); with --ray, tasks in flight")
    out.add_argument("--ray", metavar="ADDRESS", default=None,
                     help="run on a Ray cluster: an address, or `auto`")


def _list(text: str, kind: type = str) -> list:
    """'a,b' -> [a, b] read as `kind`; an empty item, or a number <= 0, is an error."""
    parts = [part.strip() for part in text.split(",")]
    if text.strip() and not all(parts):
        raise ValueError(f"the list {text!r} has an empty item")
    try:
        values = [kind(part) for part in parts if part]
    except ValueError:
        raise ValueError(f"cannot read the list {text!r}") from None
    if kind is not str and not all(v > 0 for v in values):
        raise ValueError(f"the list {text!r} needs numbers > 0")
    return values


def _prices(text: str) -> dict[str, float]:
    prices = {}
    for item in _list(text):
        name, _, value = item.partition("=")
        try:
            prices[name] = float(value)
        except ValueError:
            raise ValueError(f"--gpu-prices: expected NAME=DOLLARS, got {item!r}") from None
    return prices


def _families(args: argparse.Namespace) -> list[Family]:
    for name in _list(args.hardware):
        hardware_spec(name)  # an unknown GPU is an error before any probe runs
    for router in _list(args.routers):
        if router not in ROUTERS:
            raise ValueError(f"unknown router {router!r}; choose from {', '.join(ROUTERS)}")
    shapes = [None, *(parse_pd(r) for r in _list(args.pd_ratios))]
    moe = resolve_model(args.model).is_moe
    dps = _list(args.dp or ("1,2,4" if moe else "1"), int)
    if any(dp > 1 for dp in dps) and not moe:
        raise ValueError(f"--data-parallel-size: {args.model} has no experts to shard; "
                         "replicas already search data parallelism")
    # Limits not given: None, each GPU's vLLM default (SearchContext.scheduler_config).
    seqs_list = [None] if args.max_num_seqs is None else _list(args.max_num_seqs, int)
    budgets = [None] if args.token_budgets is None else _list(args.token_budgets, int)
    return [Family(hw, tp, router, pd, policy, seqs, budget, dp)
            for hw in _list(args.hardware) for tp in _list(args.tp, int) for dp in dps
            for router in _list(args.routers) for pd in shapes
            for policy in _list(args.policies) for seqs in seqs_list
            for budget in budgets if pd is None or dp == 1]


def _context(args: argparse.Namespace, trace, slo: CapacitySlo) -> SearchContext:
    """What every probe of the search shares, from the flags."""
    speculative = (SpeculativeConfig.from_json(args.speculative_config)
                   if args.speculative_config else None)
    return SearchContext(trace, slo, args.model, args.dtype, _prices(args.gpu_prices),
                         args.block_size, args.max_model_len, args.kv_link_gbps,
                         args.enable_prefix_caching, args.gpu_memory_utilization, args.cost,
                         open_loop=args.open_loop, quantization=args.quantization,
                         kv_cache_dtype=args.kv_cache_dtype, speculative=speculative)


def _run(args: argparse.Namespace) -> int:
    slo = CapacitySlo(args.slo_ttft_p99_ms, args.slo_itl_p99_ms)
    low, high = _list(args.rate_range, float) if args.rate_range else (1.0, 16.0)
    trace = load_trace_from_args(args)
    context = _context(args, trace, slo)
    families, skipped = fitting_families(context, _families(args))
    for line in skipped:
        print(f"skipped {line}")
    if not families:
        raise ValueError("no deployment in the search space fits its GPUs")
    engines = engines_per_hardware(context, families)
    print_pricing(context, engines, families)
    print_engines(engines)
    runner_type = RayRunner if args.ray is not None else LocalRunner
    where = (args.ray,) if args.ray is not None else ()
    with runner_type(context, *where, args.workers, progress=True, task=run_probe) as run:
        # One probe per worker in flight, the cheapest wanted started as soon as one ends.
        search = smallest_scales(run, families, slo, args.max_engines, not args.exhaustive,
                                 None if args.exhaustive else context.usd_per_hour, args.top,
                                 args.workers or os.cpu_count() or 1,
                                 None if args.exhaustive else trace.span_s)
        met = search.met
        best = cheapest(met, per="hardware")
        run.skip(search.skipped)
        known = [[] if args.exhaustive else [r] for r in best]
        found = find_capacity(run, [DeploymentProbe(_family(r), r["scale"]) for r in best], slo,
                              low, high, stop_early=not args.exhaustive,
                              known=known) if best else []
        run.skip(sum(p is r for c, rows in zip(found, known, strict=True) for p in c.probes
                     for r in rows))
    probes = search.probes
    for row, capacity in zip(best, found, strict=True):
        row["max_qps_scale"] = capacity.qps_scale
        row["max_rate_rps"] = capacity.rate_rps
    top = cheapest(met)[:args.top]
    mark_unsearched(top, best)
    print_plan(trace, slo, best, top, run.counts)
    for line in (f"not searched: {f.label()} (dearer than {x})" for f, x in search.pruned):
        print(line)
    for row in [*best, *top]:
        row["simulate_args"] = simulate_args(row, context)
    payload = {"trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
               "slo": {"ttft_p99_ms": slo.ttft_p99_ms, "itl_p99_ms": slo.itl_p99_ms},
               "cheapest_per_hardware": best, "cheapest": top,
               "skipped": skipped, "probes": len(probes), "cost_model": cost_name(args.cost),
               "speculative_config": (context.speculative.as_record()
                                      if context.speculative else None),
               "engine_per_hardware": engines,
               "runs": run.counts,
               "not_searched": [{"deployment": f.label(), "dearer_than": x}
                                for f, x in search.pruned]}
    if args.out is not None:
        write_plan_out(args.out, probes, best, slo, trace.name)
    if args.json is not None:
        write_json_atomic(args.json, payload)
    return 0


def _family(row: dict) -> Family:
    pd_ratio = None if not row["pd"] else tuple(v // row["scale"] for v in parse_pd(row["pd"]))
    return Family(row["hardware"], row["tp"], row["router"], pd_ratio, row["policy"],
                  row["max_num_seqs"], row["token_budget"], row.get("dp", 1))
