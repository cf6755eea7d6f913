"""`calibrate --url` and `validate --url`: a running server probed, fitted and replayed."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
import time
from dataclasses import dataclass

from tqdm import tqdm

from executor.loading import cpu_model
from servelab.calibration.fit import save_calibration
from servelab.calibration.remote import (
    OUTLIER_ERROR,
    Observations,
    error_by_kind,
    fit_observations,
    join_probes,
    median_decode_step,
    observe,
    outliers_by_kind,
    probes,
)

FIRST_ERRORS = 3  # errors a report lists (the count covers all)


def calibrate_url(args: argparse.Namespace) -> int:
    """Probe the server at --url, fit the cost model and its request overhead, save them."""
    from servelab.bench.client import BenchConfig
    from servelab.bench.probe import read_limits, run_probes

    config = BenchConfig(args.url, args.model, args.api_key)
    limits, card = asyncio.run(read_limits(config, args.max_num_seqs, args.token_budget))
    if limits.num_blocks is None and args.num_blocks is None:
        raise ValueError(f"{args.url} does not publish its KV pool (vllm:cache_config_info "
                         "on /metrics): pass --num-blocks")
    vocab = args.vocab_size or card.get("vocab_size")
    if not vocab:
        raise ValueError(f"{args.url} does not report its vocab size; pass --vocab-size")
    started = time.perf_counter()
    observed = Observations(limits.row_knots)
    first = probes(limits, args.quick)
    # A server's first requests pay for what later ones find ready (threads woken, buffers
    # grown): one of each lone probe runs first, unobserved. Each set of probes gets its own
    # seed, so that no prompt repeats one before it and the prefix cache serves none.
    warmup = [probe for probe in first if probe.kind == "lone"][::2]
    with tqdm(total=len(warmup) + len(first) + 3, unit="probe", file=sys.stderr, leave=False,
              disable=None) as bar:

        def run(batch: list, seed: int) -> list:
            return asyncio.run(run_probes(batch, config, vocab, seed, bar.update))

        run(warmup, args.seed + 2)
        for probe, seen in zip(first, run(first, args.seed), strict=True):
            observe(probe, seen, limits, observed)
        joins = join_probes(limits, median_decode_step(observed), args.quick)
        for probe, seen in zip(joins, run(joins, args.seed + 1), strict=True):
            observe(probe, seen, limits, observed)
    probing_s = time.perf_counter() - started
    fit, kept = fit_observations(observed)
    outliers = outliers_by_kind(observed, kept)
    server = {"url": args.url, "model": card["id"], "policy": args.server_policy,
              "max_num_seqs": limits.max_num_seqs, "token_budget": limits.token_budget,
              "num_blocks": limits.num_blocks or args.num_blocks,
              "block_size": limits.block_size or args.block_size,
              "max_model_len": limits.max_model_len,
              "enable_prefix_caching": limits.enable_prefix_caching}
    meta = {"model": card["id"], "hardware": f"the server at {args.url}",
            "client": cpu_model(), "date": datetime.date.today().isoformat(),
            "block_size": server["block_size"], "num_blocks": server["num_blocks"],
            "max_model_len": limits.max_model_len, "server": server,
            "probes": len(first) + len(joins), "observations": len(observed.seconds),
            "outliers_by_kind": outliers,
            "probing_s": round(probing_s, 1),
            "holdout_error_by_kind": error_by_kind(observed, fit.held_error, kept)}
    save_calibration(fit, args.out, meta)
    print(f"probed {args.url} ({card['id']}): {len(first) + len(joins)} probes, "
          f"{len(observed.seconds)} observations in {probing_s:.0f} s")
    if outliers:
        print(f"left out of the fit, off it by more than {OUTLIER_ERROR:g}x the median error: "
              + ", ".join(f"{count} {kind}" for kind, count in outliers.items()))
    print(fit.describe())
    print("held-out error by kind: " + ", ".join(
        f"{kind} {error:.1%}" for kind, error in meta["holdout_error_by_kind"].items()))
    print(f"request overhead (the server's path, in every TTFT): "
          f"{fit.model.request_overhead_s * 1e3:.2f} ms")
    print(f"wrote {args.out}")
    return 0


def validate_url(args: argparse.Namespace) -> int:
    """Replay the trace against --url (--repeats times) and simulate it as that server."""
    from servelab.calibration.validation import VALIDATED, compare, overall
    from servelab.sim_args import scheduler_config, write_json_atomic
    from servelab.trace_args import load_trace_from_args
    from servelab.validate_output import format_errors, format_overall
    from sim.cost.calibrated import CalibratedCostModel
    from sim.replay.metrics import summarize

    if args.cost_model is None:
        raise ValueError("validate --url needs --cost-model (a calibration from calibrate --url)")
    model = CalibratedCostModel.load(args.cost_model)
    server = model.meta.get("server") or {}
    policy = server.get("policy") or args.server_policy
    num_blocks = args.num_blocks or server.get("num_blocks") or model.meta.get("num_blocks")
    if num_blocks is None:
        raise ValueError(f"{args.cost_model} does not record the server's KV pool: pass "
                         "--num-blocks")
    config = scheduler_config(args, policy, num_blocks,
                              server.get("max_model_len") or model.meta.get("max_model_len"),
                              server=server)
    trace = load_trace_from_args(args)
    runs, served, failures = _replay(args, trace, num_blocks, config.max_num_seqs)
    results, pairs = compare(trace, {policy: config}, {policy: runs}, model)
    results[policy]["measured_runs"] = [  # each replay's own values: the server's noise
        {key: summary.get(key) for key in VALIDATED}
        for summary in (summarize(run) for run in runs)]
    print(f"trace {trace.name}: {len(trace)} requests against {args.url} ({served}); "
          f"simulated as {policy}, {config.num_blocks} KV blocks of {config.block_size}, "
          f"max_num_seqs {config.max_num_seqs}, token budget {config.budget}; cost model "
          f"{args.cost_model}")
    print(failures.describe())
    print(format_errors(results))
    print(format_overall(results))
    if args.out is not None:
        from servelab.reporting.charts.fidelity_charts import write_validation

        write_validation(args.out, trace.name, results, pairs)
    if args.json is not None:
        write_json_atomic(args.json, {
            "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
            "config": {"url": args.url, "model": served, "cost_model": str(args.cost_model),
                       "policy": policy, "num_blocks": config.num_blocks,
                       "max_num_seqs": config.max_num_seqs, "token_budget": config.budget,
                       "enable_prefix_caching": config.enable_prefix_caching},
            "results": results, "overall": overall(results), "repeats": args.repeats,
            "failed_requests": {"count": failures.count, "sent": failures.sent,
                                "retried": failures.retried,
                                "first_errors": list(failures.first)},
        })
    return 0


@dataclass(frozen=True)
class Failures:
    """Requests of the replays that got no complete answer (as `vllm bench serve` counts
    them), the first errors, and the requests sent a second time because their first try
    never reached the server (servelab.bench.connection)."""

    count: int
    sent: int
    first: tuple[str, ...]
    max_share: float  # --max-failed-share
    retried: int = 0

    def describe(self) -> str:
        text = (f"{self.count} of {self.sent} requests failed ({self.count / self.sent:.1%}; "
                f"--max-failed-share {self.max_share:.1%}), {self.retried} retried on a new "
                "connection")
        return text + (", the first failures: " + "; ".join(self.first) if self.first else "")


def _replay(args: argparse.Namespace, trace, num_blocks: int, max_num_seqs: int
            ) -> tuple[list, str, Failures]:
    """Replay the trace --repeats times, each with another seed (other prompts: nothing
    cached from before): the runs, the served model, and the requests that failed; more of
    those than --max-failed-share of the requests sent is an error."""
    from servelab.bench.client import BenchConfig, replay_trace
    from sim.replay.simulation import RunResult

    bench = BenchConfig(args.url, args.model, args.api_key)
    runs, errors, retried = [], [], 0
    for k in range(args.repeats):
        with tqdm(total=len(trace), unit="req", file=sys.stderr, leave=False,
                  disable=None) as bar:
            served, _, result = asyncio.run(replay_trace(
                trace, bench, args.vocab_size, args.seed + k, lambda: bar.update(1)))
        errors += result.errors
        retried += result.retried
        runs.append(RunResult(result.requests, [], result.preemptions or 0, num_blocks,
                              max_num_seqs))
    failures = Failures(len(errors), len(trace) * args.repeats, tuple(errors[:FIRST_ERRORS]),
                        args.max_failed_share, retried)
    if failures.count > failures.max_share * failures.sent:
        raise ValueError(f"{args.url}: {failures.describe()}; raise --max-failed-share to "
                         "validate on the rest")
    return runs, served, failures
