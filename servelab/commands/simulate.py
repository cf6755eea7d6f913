"""`servelab simulate` and `servelab compare`: replay a trace through the SimPy simulator."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path

from servelab.cluster_args import add_cluster_args, cluster_from_args, describe_cluster
from servelab.commands.compare_speculative import (
    add_speculative_compare_args,
    run_speculative_compare,
)
from servelab.sim_args import (
    add_cost_model_args,
    add_output_args,
    add_scheduler_args,
    default_policy,
    deployment_options,
    deployment_scheduler_config,
    format_classes,
    format_summaries,
    parse_policies,
    write_json_atomic,
)
from servelab.slo_args import add_slo_p99_args, slo_from_args, slo_p99_verdicts
from servelab.trace_args import OPEN_LOOP_HELP, add_rate_args, add_trace_args, load_trace_from_args
from sim.cost.drafter import DrafterCost
from sim.deployment import Deployment, build_deployment
from sim.engine.core import Backend
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.speculation.report import configured_summary, format_speculation
from sim.policy_runs import PolicyOutcome, simulate_policies
from sim.replay.overload import Overload
from workloads import Trace

ALL_POLICIES = "static,continuous,recompute,chunked"  # what compare runs by default


def register(subparsers: argparse._SubParsersAction) -> None:
    sim = subparsers.add_parser("simulate", help="simulate one policy on a trace")
    add_trace_args(sim, positional=False)
    add_rate_args(sim)
    sim.add_argument("--policy", default=None,
                     help="static|continuous|recompute|chunked (default continuous; chunked, "
                          "as vLLM runs, when --model or --hardware names a deployment; or the "
                          "policy of the server a calibration came from)")
    _add_deployment_args(sim)
    sim.set_defaults(func=lambda args: _run(args, None))

    cmp = subparsers.add_parser("compare", help="simulate several policies on one trace")
    add_trace_args(cmp, positional=False)
    add_rate_args(cmp)
    cmp.add_argument("--policies", default=None,
                     help=f"comma-separated policies (default {ALL_POLICIES}; with "
                          "--speculative, the deployment's default policy)")
    cmp.add_argument("--workers", type=int, default=None,
                     help="processes to run policies in (default: one per policy, <= cores)")
    _add_deployment_args(cmp)
    add_speculative_compare_args(cmp)
    cmp.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    """compare's policies; with --speculative, the speculative crossover instead."""
    if args.speculative is not None:
        policies = None if args.policies is None else parse_policies(args.policies)
        return run_speculative_compare(args, policies)
    if args.qps_scales is not None:
        raise ValueError("--qps-scales: only with --speculative (`servelab sweep` runs "
                         "policies across rates)")
    return _run(args, parse_policies(args.policies or ALL_POLICIES))


def _add_deployment_args(parser: argparse.ArgumentParser) -> None:
    add_scheduler_args(parser)
    add_cluster_args(parser)
    add_cost_model_args(parser)
    add_output_args(parser)
    add_slo_p99_args(parser, None, None, "the summary says whether each run holds it")
    loop = parser.add_argument_group("closed loop")
    loop.add_argument("--users", type=int, default=None,
                      help="closed loop: N users, each sending its next request (or session) "
                           "as soon as its last one finished, as bench-serve --users does")
    loop.add_argument("--open-loop", action="store_true", help=OPEN_LOOP_HELP)


def _scheduler_configs(args: argparse.Namespace, policies: list[str] | None,
                       deployment: Deployment) -> tuple[list[str], dict[str, SchedulerConfig],
                                                        str]:
    """The policies run (simulate: its --policy, or the calibrated server's), each one's
    scheduler config, and the deployment's description at the budget they run with."""
    where = deployment.description
    if policies is None:
        server_policy = dict(deployment.server_limits).get("policy")
        policies = parse_policies(args.policy or server_policy or default_policy(deployment))
    configs = {p: deployment_scheduler_config(args, p, deployment) for p in policies}
    if deployment.engine_limits.vllm:  # coverage at vLLM's budget, not the lab's default
        where = deployment.description_at(max(c.budget for c in configs.values()))
    return policies, configs, where


def _run(args: argparse.Namespace, policies: list[str] | None) -> int:
    deployment = build_deployment(deployment_options(args, args.num_blocks))
    policies, configs, where = _scheduler_configs(args, policies, deployment)
    backend, configs, drafter = _with_drafter(deployment, configs)
    # --workers and --users are >= 1 by their types (servelab.flag_types).
    if args.users is not None and args.open_loop:
        raise ValueError("--users runs a closed loop; it does not combine with --open-loop")
    cluster = cluster_from_args(args, deployment)
    trace = load_trace_from_args(args)
    slo = slo_from_args(args)
    outcomes = simulate_policies(trace, configs, backend, slo, args.out is not None,
                                  getattr(args, "workers", None), cluster, args.users,
                                  args.open_loop)
    results = {p: _with_verdict(outcomes[p]) for p in policies}
    speculative = configs[policies[0]].speculative
    if speculative is not None:
        _compare_without_speculation(args, trace, configs, deployment.cost_model, slo,
                                     cluster, results)
    held = slo_p99_verdicts(results, args.slo_ttft_p99_ms, args.slo_itl_p99_ms)
    print(f"trace {trace.name}: {len(trace)} requests over {trace.span_s:.1f} s; {where}, "
          f"{configs[policies[0]].num_blocks} KV blocks of {configs[policies[0]].block_size}; "
          f"{describe_cluster(cluster)}; {_describe_arrivals(trace, args)}")
    print(deployment.kv_pool.describe())
    print(engine_settings(configs, deployment))
    _print_results(results, {p: outcomes[p].verdict for p in policies})
    if speculative is not None:
        _print_speculation(results, drafter)
    for block in (held, rejections(trace, configs, results)):
        if block:
            print(f"\n{block}")
    payload = {
        "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
        "config": {
            "deployment": where,
            "scheduler": {p: c.as_record() for p, c in configs.items()},
            "slo": None if slo is None else asdict(slo),
            "cluster": None if cluster is None else asdict(cluster),
        },
        "results": results,
    }
    if held:  # p99 targets given: the config records them beside the goodput bounds
        payload["config"]["slo_p99"] = {"ttft_p99_ms": args.slo_ttft_p99_ms,
                                        "itl_p99_ms": args.slo_itl_p99_ms}
    if cluster is not None:
        payload["replicas"] = {p: outcomes[p].replicas.to_dict("records") for p in policies}
        for policy in policies:
            print(f"\n{policy}, per engine:")
            print(format_replicas(outcomes[policy].replicas))
    if args.out is not None:
        _write_out(args.out, chart_title(trace, args.qps_scale, where), outcomes)
        write_json_atomic(args.out / "summary.json", payload)
    if args.json is not None:  # the deployment whole; summary.json keeps its keys
        write_json_atomic(args.json, {**payload, "deployment_spec": deployment.to_dict()})
    return _served_something(results, args.command)


def engine_settings(configs: dict[str, SchedulerConfig], deployment: Deployment) -> str:
    """The limits each policy ran with, and whose defaults filled the unset ones."""
    whose = ("vLLM's defaults for this GPU" if deployment.engine_limits.vllm
             else "servelab's CPU-lab defaults")
    settings = sorted({(c.max_num_seqs, c.budget, c.max_model_len) for c in configs.values()})
    text = "; ".join(f"max_num_seqs {seqs}, max_num_batched_tokens {budget}, max_model_len "
                     f"{length}" for seqs, budget, length in settings)
    return f"engine: {text} (unset limits: {whose})"


def rejections(trace: Trace, configs: dict[str, SchedulerConfig], results: dict) -> str:
    """Which requests each policy rejected and why, as vLLM answers them 400 ('' if none)."""
    lines = []
    for policy, config in configs.items():
        count = results[policy].get("rejected") or 0
        if not count:
            continue
        totals = trace.prompt_len + trace.output_len
        reasons = [config.never_fits(int(n)) for n in totals]
        first = next((r for r in reasons if r), "longer than the engine takes")
        lines.append(f"{policy}: rejected {count} of {len(trace)} requests (HTTP 400 from a "
                     f"server), e.g. {first}")
    return "\n".join(lines)


def _served_something(results: dict[str, dict], command: str) -> int:
    """0, or 1 with a one-line error when some policy completed no request."""
    empty = [p for p, summary in results.items() if not summary.get("completed")]
    if not empty:
        return 0
    print(f"servelab {command}: error: {', '.join(empty)} served no request (see the "
          "rejections above)",
          file=sys.stderr)
    return 1


def _with_drafter(deployment: Deployment, configs: dict[str, SchedulerConfig]
                  ) -> tuple[Backend, dict[str, SchedulerConfig], DrafterCost | None]:
    """The backend and configs a run prices with (Deployment.speculative_pricing), the
    configs' speculation marked as priced where a drafter prices it."""
    speculative = next(iter(configs.values())).speculative
    backend, priced, drafter = deployment.speculative_pricing(speculative)
    if priced is not speculative:
        configs = {p: replace(c, speculative=priced) for p, c in configs.items()}
    return backend, configs, drafter


def _print_speculation(results: dict[str, dict], drafter: DrafterCost | None) -> None:
    """The drafter priced, if any, and each policy's acceptance and speedups."""
    if drafter is not None:
        print(f"drafter: {drafter.description}")
    for p, result in results.items():
        print(f"{p}: {format_speculation(result)}")


def _compare_without_speculation(args, trace, configs, backend, slo, cluster,
                                 results: dict[str, dict]) -> None:
    """Replay again without speculation; add acceptance and the speedups to results."""
    plain = simulate_policies(
        trace, {p: replace(c, speculative=None) for p, c in configs.items()}, backend, slo,
        False, getattr(args, "workers", None), cluster, args.users, args.open_loop)
    for p, config in configs.items():
        results[p].update(configured_summary(config.speculative, results[p], plain[p].summary))


def _print_results(results: dict[str, dict], verdicts: dict[str, Overload | None]) -> None:
    """The summary table, the overload verdicts, and the per-class tables if any."""
    print(format_summaries(results))
    for block in (format_verdicts(verdicts), format_classes(results)):
        if block:
            print(f"\n{block}")


def _with_verdict(outcome: PolicyOutcome) -> dict:
    """The summary, and under "verdict" the overload verdict (one engine's runs only)."""
    if outcome.verdict is None:
        return outcome.summary
    return {**outcome.summary, "verdict": outcome.verdict.to_dict()}


def format_verdicts(verdicts: dict[str, Overload | None]) -> str:
    """One line per policy: kept up or not, how fast the queue grows, what bound it."""
    return "\n".join(f"{policy}: {_verdict_line(v)}" for policy, v in verdicts.items()
                     if v is not None)


def _verdict_line(v: Overload) -> str:
    falling = v.state == "falling behind"
    if v.sustainable_rps is None:
        sustainable = "no busy time"
    else:  # a light run's small batches make it a lower bound
        sustainable = (f"sustainable {'~' if falling else 'at least '}"
                       f"{v.sustainable_rps:.2f} req/s, completed per busy second")
    if v.binding == "none":
        bound = "no request waited"
    elif falling:
        bound = f"bound by {v.binding} ({v.binding_share:.0%} of the steps that left " \
                "requests waiting)"
    else:
        bound = f"requests left waiting after {v.waited_share:.0%} of steps, mostly by " \
                f"{v.binding}"
    return (f"{v.state}: the queue grows {v.queue_growth_rps:+.2f} req/s over the second "
            f"half of arrivals (offered {v.offered_rps:.2f} req/s, {sustainable}); {bound}")


def _describe_arrivals(trace: Trace, args: argparse.Namespace) -> str:
    """How requests are sent: as written, or each after the answer it waits for."""
    if args.users is not None:
        return f"closed loop: {args.users} users"
    if trace.has_sessions and not args.open_loop:
        return "closed loop: each turn after the previous answer"
    return "open loop"


def chart_title(trace: Trace, qps_scale: float, deployment: str) -> str:
    """The run in a few words for chart titles: trace, its rate, model and GPU."""
    scaled = f" x{qps_scale:g}" if qps_scale != 1 else ""
    rate = f"{len(trace) / trace.span_s:.2f} req/s" if trace.span_s > 0 else "all at once"
    return f"{trace.name}{scaled} at {rate}; {deployment.split('; ')[0]}"


def _write_out(out_dir: Path, title: str, outcomes: dict[str, PolicyOutcome]) -> None:
    from servelab.reporting.charts.basic import write_run_outputs

    charts, tables = write_run_outputs({p: o.tables for p, o in outcomes.items()}, out_dir,
                                       title, {p: o.replicas for p, o in outcomes.items()})
    print(f"wrote {charts} charts and {tables} tables to {out_dir}")


def format_replicas(table) -> str:
    """The per-engine table as text."""
    return table.to_string(index=False, float_format=lambda v: f"{v:.3g}")
