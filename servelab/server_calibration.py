"""`calibrate --url` and `validate --url`: a running server probed, fitted and replayed."""

from __future__ import annotations

import asyncio
import datetime
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from executor.calibration.fit import save_calibration
from executor.loading import cpu_model
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
from sim.cost.calibrated import CalibratedCostModel
from sim.engine.scheduler_config import SchedulerConfig
from workloads.trace import Trace

if TYPE_CHECKING:  # the HTTP client loads only when a command talks to a server
    from servelab.bench.connection import BenchConfig

FIRST_ERRORS = 3  # errors a report lists (the count covers all)


@dataclass(frozen=True)
class UrlCalibration:
    """What `calibrate --url` asks: the server, the limits /metrics may not publish (the
    flags), and how to probe."""

    server: BenchConfig  # URL, model, API key
    out: Path  # the calibration JSON to write
    max_num_seqs: int
    token_budget: int
    num_blocks: int | None  # None: the server's /metrics publishes its pool
    block_size: int  # where /metrics does not publish it
    vocab_size: int | None  # None: the server's model card gives it
    server_policy: str | None  # the policy the server schedules by, recorded for --simulate
    quick: bool = False  # a small grid of probes
    seed: int = 0  # prompt tokens; each set of probes draws from its own seed after it


@dataclass(frozen=True)
class UrlValidation:
    """What `validate --url` asks: the server, the calibration and the scheduler it simulates
    the server as, and how often to replay."""

    server: BenchConfig
    cost_model: CalibratedCostModel
    cost_model_path: Path
    policy: str
    config: SchedulerConfig
    repeats: int = 1
    vocab_size: int | None = None
    seed: int = 0
    max_failed_share: float = 0.0  # more failed requests than this share is an error
    out: Path | None = None  # charts and tables
    json: Path | None = None


def calibrate_url(options: UrlCalibration) -> int:
    """Probe the server, fit the cost model and its request overhead, save them."""
    from servelab.bench.probe import read_limits

    config = options.server
    limits, card = asyncio.run(read_limits(config, options.max_num_seqs, options.token_budget))
    if limits.num_blocks is None and options.num_blocks is None:
        raise ValueError(f"{config.url} does not publish its KV pool (vllm:cache_config_info "
                         "on /metrics): pass --num-blocks")
    vocab = options.vocab_size or card.get("vocab_size")
    if not vocab:
        raise ValueError(f"{config.url} does not report its vocab size; pass --vocab-size")
    started = time.perf_counter()
    observed, probed = _probe(options, limits, vocab)
    probing_s = time.perf_counter() - started
    fit, kept = fit_observations(observed)
    meta = _calibration_meta(options, limits, card, fit, (observed, kept, probed, probing_s))
    save_calibration(fit, options.out, meta)
    _print_calibration(options, card, meta, fit, probing_s)
    return 0


def _probe(options: UrlCalibration, limits, vocab: int) -> tuple[Observations, int]:
    """Every probe's observations, and how many probes were timed."""
    from servelab.bench.probe import run_probes

    observed = Observations(limits.row_knots)
    first = probes(limits, options.quick)
    # A server's first requests pay for what later ones find ready (threads woken, buffers
    # grown): one of each lone probe runs first, unobserved. Each set of probes gets its own
    # seed, so that no prompt repeats one before it and the prefix cache serves none.
    warmup = [probe for probe in first if probe.kind == "lone"][::2]
    with tqdm(total=len(warmup) + len(first) + 3, unit="probe", file=sys.stderr, leave=False,
              disable=None) as bar:

        def run(batch: list, seed: int) -> list:
            return asyncio.run(run_probes(batch, options.server, vocab, seed, bar.update))

        run(warmup, options.seed + 2)
        for probe, seen in zip(first, run(first, options.seed), strict=True):
            observe(probe, seen, limits, observed)
        joins = join_probes(limits, median_decode_step(observed), options.quick)
        for probe, seen in zip(joins, run(joins, options.seed + 1), strict=True):
            observe(probe, seen, limits, observed)
    return observed, len(first) + len(joins)


def _calibration_meta(options: UrlCalibration, limits, card: dict, fit,
                      probing: tuple[Observations, np.ndarray, int, float]) -> dict:
    """What the calibration file records of the server, the probing and the fit; `probing`
    is the observations, those the fit kept, the probes timed and the seconds it all took."""
    observed, kept, probed, probing_s = probing
    url = options.server.url
    server = {"url": url, "model": card["id"], "policy": options.server_policy,
              "max_num_seqs": limits.max_num_seqs, "token_budget": limits.token_budget,
              "num_blocks": limits.num_blocks or options.num_blocks,
              "block_size": limits.block_size or options.block_size,
              "max_model_len": limits.max_model_len,
              "enable_prefix_caching": limits.enable_prefix_caching}
    return {"model": card["id"], "hardware": f"the server at {url}",
            "client": cpu_model(), "date": datetime.date.today().isoformat(),
            "block_size": server["block_size"], "num_blocks": server["num_blocks"],
            "max_model_len": limits.max_model_len, "server": server,
            "probes": probed, "observations": len(observed.seconds),
            "outliers_by_kind": outliers_by_kind(observed, kept),
            "probing_s": round(probing_s, 1),
            "holdout_error_by_kind": error_by_kind(observed, fit.held_error, kept)}


def _print_calibration(options: UrlCalibration, card: dict, meta: dict, fit,
                       probing_s: float) -> None:
    outliers = meta["outliers_by_kind"]
    print(f"probed {options.server.url} ({card['id']}): {meta['probes']} probes, "
          f"{meta['observations']} observations in {probing_s:.0f} s")
    if outliers:
        print(f"left out of the fit, off it by more than {OUTLIER_ERROR:g}x the median error: "
              + ", ".join(f"{count} {kind}" for kind, count in outliers.items()))
    print(fit.describe())
    print("held-out error by kind: " + ", ".join(
        f"{kind} {error:.1%}" for kind, error in meta["holdout_error_by_kind"].items()))
    print(f"request overhead (the server's path, in every TTFT): "
          f"{fit.model.request_overhead_s * 1e3:.2f} ms")
    print(f"wrote {options.out}")


def validate_url(options: UrlValidation, trace: Trace) -> int:
    """Replay the trace against the server (`repeats` times) and simulate it as that server."""
    from executor.calibration.validation import VALIDATED, compare, overall
    from servelab.sim_args import write_json_atomic
    from servelab.validate_output import format_errors, format_overall
    from sim.replay.metrics import summarize

    policy, config, url = options.policy, options.config, options.server.url
    runs, served, failures = _replay(options, trace, config.num_blocks, config.max_num_seqs)
    results, pairs = compare(trace, {policy: config}, {policy: runs}, options.cost_model)
    results[policy]["measured_runs"] = [  # each replay's own values: the server's noise
        {key: summary.get(key) for key in VALIDATED}
        for summary in (summarize(run) for run in runs)]
    print(f"trace {trace.name}: {len(trace)} requests against {url} ({served}); "
          f"simulated as {policy}, {config.num_blocks} KV blocks of {config.block_size}, "
          f"max_num_seqs {config.max_num_seqs}, token budget {config.budget}; cost model "
          f"{options.cost_model_path}")
    print(failures.describe())
    print(format_errors(results))
    print(format_overall(results))
    if options.out is not None:
        from servelab.reporting.charts.fidelity_charts import write_validation

        write_validation(options.out, trace.name, results, pairs)
    if options.json is not None:
        write_json_atomic(options.json, {
            "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
            "config": {"url": url, "model": served, "cost_model": str(options.cost_model_path),
                       "policy": policy, "num_blocks": config.num_blocks,
                       "max_num_seqs": config.max_num_seqs, "token_budget": config.budget,
                       "enable_prefix_caching": config.enable_prefix_caching},
            "results": results, "overall": overall(results), "repeats": options.repeats,
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


def _replay(options: UrlValidation, trace: Trace, num_blocks: int, max_num_seqs: int
            ) -> tuple[list, str, Failures]:
    """Replay the trace `repeats` times, each with another seed (other prompts: nothing
    cached from before): the runs, the served model, and the requests that failed; more of
    those than max_failed_share of the requests sent is an error."""
    from servelab.bench.client import replay_trace
    from sim.replay.simulation import RunResult

    runs, errors, retried = [], [], 0
    for k in range(options.repeats):
        with tqdm(total=len(trace), unit="req", file=sys.stderr, leave=False,
                  disable=None) as bar:
            served, _, result = asyncio.run(replay_trace(
                trace, options.server, options.vocab_size, options.seed + k,
                lambda: bar.update(1)))
        errors += result.errors
        retried += result.retried
        runs.append(RunResult(result.requests, [], result.preemptions or 0, num_blocks,
                              max_num_seqs))
    failures = Failures(len(errors), len(trace) * options.repeats,
                        tuple(errors[:FIRST_ERRORS]), options.max_failed_share, retried)
    if failures.count > failures.max_share * failures.sent:
        raise ValueError(f"{options.server.url}: {failures.describe()}; raise "
                         "--max-failed-share to validate on the rest")
    return runs, served, failures
