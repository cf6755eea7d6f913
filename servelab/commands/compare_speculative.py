"""`servelab compare --speculative JSON`: each policy over a range of rates with and without
speculative decoding, the crossover (where speculation stops paying) and its chart."""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from servelab.cluster_args import cluster_from_args
from servelab.sim_args import deployment_options, deployment_scheduler_config, write_json_atomic
from servelab.slo_args import slo_from_args
from servelab.sweeps.runners import LocalRunner
from servelab.sweeps.speculative import (
    DEFAULT_SPECULATIVE_QPS_SCALES,
    SpeculativeSweep,
    crossover,
    describe_crossover,
    paired_rows,
    run_speculative_point,
    speculative_points,
)
from servelab.trace_args import load_trace_from_args
from sim.deployment import build_deployment
from sim.engine.speculation.config import SpeculativeConfig
from sim.engine.speculation.report import configured_summary

QPS_SCALES_TEXT = ",".join(f"{x:g}" for x in DEFAULT_SPECULATIVE_QPS_SCALES)
_POINT_KEYS = ("policy", "qps_scale", "speculative", "rate_rps")


def add_speculative_compare_args(parser: argparse.ArgumentParser) -> None:
    """--speculative and --qps-scales on `compare`."""
    group = parser.add_argument_group("speculative crossover")
    group.add_argument("--speculative", default=None, metavar="JSON",
                       help="compare each policy with and without this speculative config "
                            "(as --speculative-config) across --qps-scales, and chart where "
                            "speculation stops paying")
    group.add_argument("--qps-scales", default=None,
                       help="with --speculative: rates as multiples of the trace's own, on top "
                            f"of --qps-scale (default {QPS_SCALES_TEXT}; 1 is always run)")


def run_speculative_compare(args: argparse.Namespace, policies: list[str] | None) -> int:
    """The crossover sweep; `policies` None: the deployment's default policy."""
    speculative = _checked_speculative(args)
    scales = _qps_scales(args.qps_scales)
    deployment = build_deployment(deployment_options(args, args.num_blocks))
    policies = policies or [None]
    configs = {}
    for policy in policies:  # (a policy that cannot speculate, static, fails here)
        config = replace(deployment_scheduler_config(args, policy, deployment),
                         speculative=speculative)
        configs[config.policy] = config
    sweep = SpeculativeSweep(load_trace_from_args(args), deployment.cost_model, configs,
                             slo_from_args(args), cluster_from_args(args, deployment),
                             args.users, args.open_loop)
    points = speculative_points(list(configs), scales)
    with LocalRunner(sweep, args.workers, progress=True, task=run_speculative_point) as run:
        rows = run(points)
    paired = paired_rows(rows)
    crossovers = {p: crossover([r for r in paired if r["policy"] == p]) for p in configs}
    where = deployment.description
    payload = _payload(sweep, where, scales, speculative, rows, paired, crossovers)
    _print(sweep, where, speculative, paired, crossovers)
    if args.out is not None:
        _write_out(args.out, sweep, where, speculative, paired, crossovers)
        write_json_atomic(args.out / "summary.json", payload)
    if args.json is not None:
        write_json_atomic(args.json, {**payload, "deployment_spec": deployment.to_dict()})
    return 0


def _checked_speculative(args: argparse.Namespace) -> SpeculativeConfig:
    """The --speculative config, checked against the flags it does not combine with."""
    if args.speculative_config:
        raise ValueError("--speculative runs with and without speculation itself; drop "
                         "--speculative-config")
    speculative = SpeculativeConfig.from_json(args.speculative)
    if not speculative.acceptance_rates:
        raise ValueError("--speculative: simulation needs acceptance_rates (no model "
                         "verifies the proposals)")
    return speculative


def _qps_scales(text: str | None) -> list[float]:
    """--qps-scales as sorted floats > 0, with 1 (the trace's own rate) among them."""
    if text is None:
        return sorted(DEFAULT_SPECULATIVE_QPS_SCALES)
    items = [v.strip() for v in text.split(",")]
    try:
        scales = [float(v) for v in items]
    except ValueError:
        raise ValueError(f"--qps-scales: expected comma-separated numbers, got {text!r}") \
            from None
    if not all(s > 0 and s != float("inf") for s in scales):
        raise ValueError(f"--qps-scales: values must be finite and > 0, got {text!r}")
    return sorted({*scales, 1.0})


def _payload(sweep: SpeculativeSweep, where: str, scales: list[float],
             speculative: SpeculativeConfig, rows: list[dict], paired: list[dict],
             crossovers: dict[str, dict]) -> dict:
    """compare's --json layout (trace, config, results: each policy at the trace's own rate
    with speculation, and its speedups), plus the sweep and the crossover."""
    trace = sweep.trace
    results = {}
    for policy in sweep.configs:
        spec, plain = ({k: v for k, v in r.items() if k not in _POINT_KEYS} for r in (
            _row(rows, policy, True), _row(rows, policy, False)))
        results[policy] = {**spec, **configured_summary(speculative, spec, plain)}
    return {
        "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
        "config": {
            "deployment": where,
            "scheduler": {p: c.as_record() for p, c in sweep.configs.items()},
            "slo": None if sweep.slo is None else asdict(sweep.slo),
            "cluster": None if sweep.cluster is None else asdict(sweep.cluster),
            "speculative": speculative.as_record(),
            "qps_scales": scales,
        },
        "results": results,
        "speculative_sweep": paired,  # one row per policy and rate, plain beside speculative
        "speculative_runs": rows,  # every run's whole summary
        "crossover": crossovers,
    }


def _row(rows: list[dict], policy: str, speculative: bool) -> dict:
    """The run at the trace's own rate."""
    return next(r for r in rows if r["policy"] == policy and r["qps_scale"] == 1.0
                and r["speculative"] is speculative)


def describe_speculation(speculative: SpeculativeConfig) -> str:
    """The assumption every number rests on, in a few words."""
    rates = ", ".join(f"{r:g}" for r in speculative.acceptance_rates)
    return (f"{speculative.method} k={speculative.num_speculative_tokens}, acceptance per "
            f"position [{rates}] assumed (mean accepted length "
            f"{1 + sum(speculative.acceptance_rates):.2f})")


def _print(sweep: SpeculativeSweep, where: str, speculative: SpeculativeConfig,
           paired: list[dict], crossovers: dict[str, dict]) -> None:
    trace = sweep.trace
    print(f"trace {trace.name}: {len(trace)} requests over {trace.span_s:.1f} s (scale 1); "
          f"{where}; speculative {describe_speculation(speculative)}")
    print(format_paired(paired))
    for policy, record in crossovers.items():
        print(describe_crossover(policy, record))


def format_paired(paired: list[dict]) -> str:
    """The sweep as a table: TPOT and throughput, plain and speculative, by rate."""
    head = (f"{'policy':<11}{'qps x':>7}{'req/s':>8}{'TPOT plain':>12}{'TPOT spec':>11}"
            f"{'speedup':>9}{'tok/s plain':>13}{'tok/s spec':>12}{'speedup':>9}")

    def cell(value, fmt: str, width: int) -> str:
        return f"{'-' if value is None else format(value, fmt):>{width}}"

    lines = [head]
    for r in paired:
        lines.append(f"{r['policy']:<11}{r['qps_scale']:>7.3g}{r['rate_rps']:>8.2f}"
                     + cell(r["plain_mean_tpot_ms"], ".2f", 12)
                     + cell(r["spec_mean_tpot_ms"], ".2f", 11)
                     + cell(r["tpot_speedup"], ".2f", 9)
                     + cell(r["plain_output_throughput"], ".0f", 13)
                     + cell(r["spec_output_throughput"], ".0f", 12)
                     + cell(r["throughput_speedup"], ".3f", 9))
    return "\n".join(lines)


def _write_out(out_dir: Path, sweep: SpeculativeSweep, where: str,
               speculative: SpeculativeConfig, paired: list[dict],
               crossovers: dict[str, dict]) -> None:
    """speculative_sweep.csv and the crossover chart."""
    from servelab.reporting.charts.speculative_chart import crossover_chart
    from workloads.formats.files import atomic_output

    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_output(out_dir / "speculative_sweep.csv") as temp:
        pd.DataFrame(paired).to_csv(temp, index=False)
    trace, rates = sweep.trace, [r["rate_rps"] for r in paired]
    title = (f"speculative decoding against load: {describe_speculation(speculative)}\n"
             f"{trace.name}, {len(trace)} requests at {min(rates):.2f}-{max(rates):.2f} "
             f"req/s; {where.split('; ')[0]}, simulated")
    notes = [describe_crossover(p, r) for p, r in crossovers.items()]
    path = crossover_chart(paired, crossovers, out_dir, title, notes)
    print(f"wrote speculative_sweep.csv and {path.name} to {out_dir}")
