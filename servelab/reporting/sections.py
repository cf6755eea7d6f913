"""The sections of `servelab report`: each runs its experiment, draws its chart and states
its finding in one line. Simulated sections use the default deployment (Llama-3-8B, bf16,
one H100, priced by the fitted GPU model with vLLM's KV pool, as the CLI resolves it);
measured ones run the peer-45m model on this machine's CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from servelab.reporting.charts import report_charts
from sim.deployment import DeploymentOptions, build_deployment
from sim.engine.core import Backend, Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.metrics import summarize
from sim.replay.simulation import RunResult, run_trace
from sim.replay.workload import requests_from_trace
from sim.specs.engine_limits import ENGINE_DEFAULTS
from workloads import load_bundled
from workloads.transforms import head, scale_lengths, scale_qps

DEPLOYMENT = "Llama-3-8B bf16 on one H100 (simulated, fitted GPU model)"


@dataclass
class Section:
    title: str
    finding: str  # one line, also the chart's title
    images: list[Path]
    body: str = ""  # markdown under the chart
    data: dict = field(default_factory=dict)  # numbers for the summary JSON


def default_deployment(hardware: str = "h100") -> tuple[Backend, int]:
    """Llama-3-8B on one `hardware` GPU priced by the fitted GPU cost model (`--cost gpu`:
    the report's scenarios, overloads included, are sized for its step times) with vLLM's
    KV pool in blocks of 16."""
    deployment = build_deployment(DeploymentOptions(hardware=hardware, cost="gpu"))
    return deployment.cost_model, deployment.kv_pool.num_blocks


def _simulate(requests: list[Request], config: SchedulerConfig,
              backend: Backend) -> RunResult:
    return run_trace(requests, Engine(Scheduler(config), backend))


# ---- 1 and 5: measured and simulated on the executor ---------------------------------------

@dataclass(frozen=True)
class MeasuredWorkload:
    """The conv trace cut and shrunk to keep a 45M-parameter CPU model busy, not swamped."""

    max_requests: int = 300  # the conv workload of docs/fidelity.md (servelab validate)
    length_scale: float = 0.1
    qps_scale: float = 3.0
    # measured runs per policy, A B .. B A (executor.calibration.validation.measure_runs)
    repeats: int = 2
    model: str = "peer-45m"

    def describe(self) -> str:
        return (f"azure-conv, first {self.max_requests} requests, lengths x{self.length_scale:g}, "
                f"rate x{self.qps_scale:g}; {self.model} on this machine's CPU, simulated with "
                f"a calibration timed during the measured runs")


def measured_vs_simulated(workload: MeasuredWorkload, policies: list[str]
                          ) -> tuple[dict, dict[str, tuple[RunResult, RunResult]]]:
    """Each policy measured on the executor and simulated with a calibration whose grid was
    timed during the measured runs (servelab validate --calibrate)."""
    from executor.loading import configure_cpu_threads

    threads = configure_cpu_threads(None)
    import torch

    from executor.backend import load_model
    from executor.calibration.fit import profile_backend
    from executor.calibration.interleave import measure_and_calibrate
    from executor.calibration.validation import compare
    from executor.loading import DEFAULT_KV_CACHE_GIB, LoadedModel
    from executor.profile import GridProfile

    trace = load_bundled("azure-conv")
    trace = scale_qps(scale_lengths(head(trace, workload.max_requests), workload.length_scale),
                      workload.qps_scale)
    model = load_model(workload.model, torch.device("cpu"), torch.float32, seed=0)
    loaded = LoadedModel(model, torch.device("cpu"), torch.float32, threads, workload.model)
    backend, points, num_blocks, max_len = profile_backend(loaded, 16, DEFAULT_KV_CACHE_GIB,
                                                           None)
    configs = {p: SchedulerConfig(policy=p, num_blocks=num_blocks, max_model_len=max_len)
               for p in policies}
    measured, fit, speeds = measure_and_calibrate(
        trace, configs, model, GridProfile(backend, points), repeats=workload.repeats)
    return compare(trace, configs, measured, fit.model, speeds=speeds)


def static_vs_continuous(results: dict, workload: MeasuredWorkload, out: Path) -> Section:
    pair = {p: results[p] for p in ("static", "continuous")}
    st, co = pair["static"]["measured"], pair["continuous"]["measured"]
    gap = max(abs(pair[p]["error"][k] or 0.0) for p in pair
              for k in ("output_throughput", "median_ttft_ms", "p95_ttft_ms"))
    speedup = co["output_throughput"] / st["output_throughput"]
    finding = (f"Continuous batching serves {speedup:.1f}x "
               f"static's tokens/s with {st['median_ttft_ms'] / co['median_ttft_ms']:.1f}x lower "
               f"median TTFT (measured); static computes padding in "
               f"{1 - st['slot_utilization']:.0%} of its rows")
    path = report_charts.batching_bars(pair, finding, workload.describe(),
                                       out / "static_vs_continuous.png")
    body = (f"Measured and simulated agree on the ranking; the largest gap on these "
            f"bars is {gap:.0%} (section 5 has every metric).")
    return Section("Static vs continuous batching, measured and simulated", finding, [path],
                   body, {"static": st, "continuous": co})


def fidelity(results: dict, runs: dict, workload: MeasuredWorkload, out: Path) -> Section:
    from executor.calibration.validation import overall
    from servelab.reporting.charts.fidelity_charts import write_fidelity_charts

    paths = write_fidelity_charts(results, runs, out, workload.describe())
    summary = overall(results)
    median, worst = summary["median_abs_error"], summary["max_abs_error"]
    finding = (f"The simulator's median |error| is {median:.1%} over every policy and metric, "
               f"the worst {worst:.0%}")
    if summary["median_spread"]:
        finding += (f"; {workload.repeats} measured runs of one policy differed by "
                    f"{summary['median_spread']:.1%} (median)")
    rows = ["| policy | metric | measured | simulated | error |", "|---|---|---:|---:|---:|"]
    for policy, r in results.items():
        for key, error in r["error"].items():
            m, s = r["measured"].get(key), r["simulated"].get(key)
            rows.append(f"| {policy} | {key} | {_num(m)} | {_num(s)} | "
                        f"{'-' if error is None else f'{error:+.1%}'} |")
    return Section("Simulator fidelity", finding, paths, "\n".join(rows), summary)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


# ---- 2: the inter-token spike of a long prefill --------------------------------------------

def itl_spike(out: Path, decoders: int = 16, long_prompt: int = 7000) -> Section:
    backend, num_blocks = default_deployment()

    def workload() -> list[Request]:
        requests = [Request(f"decode-{i}", 0.01 * i, 256, 500) for i in range(decoders)]
        return requests + [Request("long-prompt", 2.0, long_prompt, 64)]

    default = f"chunked, budget {ENGINE_DEFAULTS.token_budget}"
    configs = {"continuous": SchedulerConfig("continuous", num_blocks),
               default: SchedulerConfig("chunked", num_blocks),
               "chunked, budget 512": SchedulerConfig("chunked", num_blocks, token_budget=512)}
    runs = {label: _simulate(workload(), config, backend) for label, config in configs.items()}
    watch = [f"decode-{i}" for i in range(decoders)]
    worst = {label: max(float(np.max(np.diff(r.token_times_s))) for r in run.requests
                        if r.request_id in watch) * 1e3 for label, run in runs.items()}
    ttft = {label: next(1e3 * (r.token_times_s[0] - r.arrival_s) for r in run.requests
                        if r.request_id == "long-prompt") for label, run in runs.items()}
    finding = (f"A {long_prompt:,}-token prompt stalls all {decoders} decodes for "
               f"{worst['continuous']:.0f} ms; chunked prefill caps the gap at "
               f"{worst[default]:.0f} ms (budget {ENGINE_DEFAULTS.token_budget}) or "
               f"{worst['chunked, budget 512']:.0f} ms (512)")
    subtitle = (f"{decoders} requests decoding 500 tokens, one long prompt arriving at 2 s; "
                f"{DEPLOYMENT}")
    path = report_charts.token_gaps(runs, watch, "long-prompt", finding, subtitle,
                                    out / "itl_spike.png")
    rows = ["| policy | worst decode gap (ms) | long prompt's TTFT (ms) |", "|---|---:|---:|"]
    rows += [f"| {label} | {worst[label]:.1f} | {ttft[label]:.1f} |" for label in runs]
    body = ("The price of the flat line is the long prompt's own TTFT, computed over several "
            "steps:\n\n" + "\n".join(rows))
    return Section("The inter-token spike of a long prefill", finding, [path], body,
                   {"worst_gap_ms": worst, "long_prompt_ttft_ms": ttft})


# ---- 3: an undersized KV pool --------------------------------------------------------------

def starvation(out: Path, requests: int = 1000, qps_scale: float = 2.0,
               small_blocks: int = 600) -> Section:
    backend, num_blocks = default_deployment()
    trace = scale_qps(head(load_bundled("azure-conv"), requests), qps_scale)
    pools = {"undersized": small_blocks, "default": num_blocks}
    runs: dict[str, dict[str, RunResult]] = {}
    summaries: dict[str, dict[str, dict]] = {}
    for policy in ("continuous", "recompute", "chunked"):
        runs[policy], summaries[policy] = {}, {}
        for pool, blocks in pools.items():
            run = _simulate(requests_from_trace(trace), SchedulerConfig(policy, blocks), backend)
            runs[policy][pool], summaries[policy][pool] = run, summarize(run)
    small = {p: s["undersized"] for p, s in summaries.items()}
    done = min(s["completed"] for s in small.values())
    worst = max(small, key=lambda p: small[p]["preemptions"])
    ratio = small[worst]["p99_e2el_ms"] / summaries[worst]["default"]["p99_e2el_ms"]
    finding = (f"A {small_blocks}-block pool ({small_blocks * 16:,} tokens, "
               f"1/{num_blocks // small_blocks} of the default) still completes "
               f"{done:,} of {len(trace):,} requests under every policy; {worst} preempts "
               f"{small[worst]['preemptions']:,} times and its p99 E2EL grows {ratio:.0f}x")
    subtitle = (f"azure-conv, first {len(trace):,} requests at x{qps_scale:g} rate; solid: "
                f"{small_blocks} blocks, dotted: {num_blocks:,}; {DEPLOYMENT}")
    path = report_charts.starvation(runs, summaries, finding, subtitle,
                                    out / "undersized_pool.png")
    rows = ["| policy | pool | completed | rejected | preemptions | p99 TTFT (s) | "
            "p99 E2EL (s) |", "|---|---|---:|---:|---:|---:|---:|"]
    for policy, by_pool in summaries.items():
        for pool, s in by_pool.items():
            rows.append(f"| {policy} | {pool} | {s['completed']:,} | {s['rejected']} | "
                        f"{s['preemptions']:,} | {s['p99_ttft_ms'] / 1e3:.1f} | "
                        f"{s['p99_e2el_ms'] / 1e3:.1f} |")
    return Section("An undersized KV pool", finding, [path], "\n".join(rows),
                   {p: {k: {m: s[m] for m in ("completed", "preemptions", "p99_ttft_ms",
                                               "p99_e2el_ms")} for k, s in by.items()}
                    for p, by in summaries.items()})
