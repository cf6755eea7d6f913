"""Capacity planning: the cheapest deployments that hold a latency SLO on a trace.

A family fixes the GPU, tensor-parallel degree, router, P/D ratio and engine limits; its
scale is the number of replicas (co-located) or of P:D groups (scale x P prefill and
scale x D decode engines). The planner finds each family's smallest scale meeting the SLO
at the trace's rate (latency falls as engines are added: doubling from 1, then bisection),
prices it in GPU-hours, and then finds the highest rate the cheapest ones hold. Each round
runs one probe per unfinished family through a sweep runner, so a pool works on all of
them at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from sim.closed_loop import closed_loop
from sim.cluster import DEFAULT_KV_LINK_GBPS, ClusterConfig
from sim.cost_model import AnalyticCostModel
from sim.deployment import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    Deployment,
    DeploymentOptions,
    build_deployment,
)
from sim.hardware import gpu_hour_usd
from sim.metrics import summarize
from sim.policy_runs import run_deployment
from sim.router import RouterConfig
from sim.scheduler import SchedulerConfig
from sim.workload import requests_from_trace
from sweeps.grid import CapacitySlo, Runner, verdict_watch
from workloads.trace import Trace
from workloads.transforms import scale_qps

DEFAULT_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class Family:
    """Everything about a deployment but how many engines it has."""

    hardware: str
    tp: int = 1
    router: str = "least-requests"
    pd: tuple[int, int] | None = None  # prefill:decode engines per group; None: co-located
    policy: str = "chunked"
    max_num_seqs: int = 256
    token_budget: int | None = None
    # Data-parallel engines per group, an MoE model's experts sharded over all of their
    # GPUs (vLLM's --data-parallel-size with --enable-expert-parallel); 1: plain replicas.
    dp: int = 1

    def engines_per_scale(self) -> int:
        return self.dp if self.pd is None else self.pd[0] + self.pd[1]

    def label(self) -> str:
        shape = "co-located" if self.pd is None else f"P/D {self.pd[0]}:{self.pd[1]}"
        parallel = f"tp{self.tp}" + (f" dp{self.dp}+ep" if self.dp > 1 else "")
        return f"{self.hardware} {parallel} {shape} {self.router}"


@dataclass(frozen=True)
class PlanPoint:
    """A family at one scale and one rate: what one simulation prices."""

    family: Family
    scale: int
    qps_scale: float = 1.0
    # Stop the run once it certainly misses this SLO (sim.verdict); None: run to the end.
    verdict: CapacitySlo | None = None


@dataclass(frozen=True)
class PlanContext:
    """What every probe shares: the trace (at its own rate), the model, the SLO, prices."""

    trace: Trace
    slo: CapacitySlo
    model: str = "llama-3-8b"
    dtype: str = "bf16"
    prices: dict[str, float] = field(default_factory=dict)  # overrides, $ per GPU-hour
    block_size: int = 16
    max_model_len: int | None = None  # None: the model's, at most 8192
    kv_link_gbps: float = DEFAULT_KV_LINK_GBPS
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    cost: str = "gpu"  # what prices steps: gpu (fitted on GPU profiles) or roofline
    open_loop: bool = False  # sessions' turns at their written times, not closed-loop

    def resolved(self, family: Family) -> Deployment:
        """One engine of the family as a Deployment (its cost model and KV pool)."""
        return build_deployment(DeploymentOptions(
            self.model, family.hardware, self.dtype, family.tp, family.dp,
            expert_parallel=family.dp > 1, block_size=self.block_size,
            gpu_memory_utilization=self.gpu_memory_utilization, cost=self.cost))

    def usd_per_hour(self, family: Family, scale: int) -> float:
        """What the family's deployment of that scale costs an hour (all of its GPUs)."""
        return scale * family.engines_per_scale() * family.tp * gpu_hour_usd(
            family.hardware, self.prices)

    def backend(self, family: Family) -> AnalyticCostModel:
        return self.resolved(family).cost_model

    def deployment(self, point: PlanPoint) -> tuple[AnalyticCostModel, SchedulerConfig,
                                                     ClusterConfig]:
        """The cost model, each engine's scheduler config and the cluster of a point."""
        family = point.family
        deployment = self.resolved(family)
        backend, spec = deployment.cost_model, deployment.model
        config = SchedulerConfig(
            policy=family.policy, num_blocks=deployment.kv_pool.num_blocks,
            block_size=self.block_size, max_num_seqs=family.max_num_seqs,
            max_model_len=self.max_model_len or min(spec.max_position_embeddings,
                                                    DEFAULT_MAX_MODEL_LEN),
            token_budget=family.token_budget, enable_prefix_caching=self.enable_prefix_caching)
        prefill, decode = (0, 0) if family.pd is None else family.pd
        cluster = ClusterConfig(
            num_replicas=point.scale * family.dp if family.pd is None else 1,
            router=RouterConfig(family.router), num_prefill=prefill * point.scale,
            num_decode=decode * point.scale, kv_link_gbps=self.kv_link_gbps,
            kv_bytes_per_token=spec.kv_bytes_per_token(backend.dtype_bytes))
        return backend, config, cluster


def run_plan_point(context: PlanContext, point: PlanPoint) -> dict:
    """Simulate one point; its row: the deployment, its price, the rate, the summary."""
    backend, config, cluster = context.deployment(point)
    trace = context.trace
    if point.qps_scale != 1:
        trace = scale_qps(trace, point.qps_scale)
    requests = requests_from_trace(trace)
    loop = closed_loop(trace, requests, open_loop=context.open_loop)  # as simulate runs it
    result, _ = run_deployment(requests, config, backend, cluster,
                               verdict_watch(requests, point.verdict, config), loop)
    summary = summarize(result)
    family = point.family
    gpus = cluster.num_engines * family.tp
    row = {key: value for key, value in asdict(family).items() if key != "pd"}
    row.update(
        deployment=family.label(),
        pd=f"{cluster.num_prefill}:{cluster.num_decode}" if cluster.disaggregated else "",
        scale=point.scale, engines=cluster.num_engines, gpus=gpus,
        usd_per_hour=context.usd_per_hour(family, point.scale),
        qps_scale=point.qps_scale, num_blocks=config.num_blocks,
        rate_rps=len(trace) / trace.span_s if trace.span_s > 0 else math.inf,
        stopped_s=result.stopped_s)
    row.update(summary)
    row["meets_slo"] = context.slo.met(row)
    return row


def fitting_families(context: PlanContext, families: Sequence[Family]
                     ) -> tuple[list[Family], list[str]]:
    """The families whose model fits their GPUs, and a line for each one left out."""
    kept, skipped = [], []
    for family in families:
        try:
            context.resolved(family)
        except ValueError as exc:
            skipped.append(f"{family.label()}: {exc}")
        else:
            kept.append(family)
    return kept, skipped


@dataclass
class ScaleSearch:
    """What smallest_scales did: each family's row at its smallest holding scale (families
    that held within max_engines and were not pruned), every probe run, and the families
    left unsearched, each with the deployment it is dearer than."""

    met: list[dict]
    probes: list[dict]
    pruned: list[tuple[Family, str]] = field(default_factory=list)
    skipped: int = 0  # probes not run: one per pruned family (the fewest it still needed)


def smallest_scales(runner: Runner, families: Sequence[Family], slo: CapacitySlo,
                    max_engines: int, stop_early: bool = True,
                    price: Callable[[Family, int], float] | None = None,
                    top: int = 0, batch: int | None = None) -> ScaleSearch:
    """Each family's smallest scale meeting the SLO (doubling, then bisection: a family
    that holds at a scale holds at every larger one). stop_early: each probe stops once it
    certainly misses the SLO (the same verdicts). With `price` ($/hour of a family at a
    scale), a family is pruned once its cheapest scale not known to fail is dearer than
    the cheapest holding deployment of its GPU and than the top-th cheapest holding one:
    it could then enter neither `cheapest` list. With price and `batch`, each round runs
    only the `batch` cheapest probes, so cheap holders are found (and dear families pruned)
    before dear probes run; each family's probes are the same, in the same order."""
    verdict = slo if stop_early else None
    state = [{"family": f, "fail": 0, "ok": None, "next": 1} for f in families]
    out = ScaleSearch([], [])
    while True:
        if price is not None:
            _prune(state, price, top, out)
        open_ = [s for s in state if s["next"] is not None]
        if not open_:
            break
        if price is not None and batch is not None:
            open_ = sorted(open_, key=lambda s: price(s["family"], s["next"]))[:batch]
        rows = runner([PlanPoint(s["family"], s["next"], verdict=verdict) for s in open_])
        out.probes += rows
        for s, row in zip(open_, rows, strict=True):
            scale = s["next"]
            if row["meets_slo"]:
                s["ok"], s["row"] = scale, row
            else:
                s["fail"] = scale
            s["next"] = _next_scale(s, _max_scale(s, max_engines))
    out.met = [s["row"] for s in state if s["ok"] is not None and not s.get("pruned")]
    return out


def _max_scale(search: dict, max_engines: int) -> int:
    return max_engines // search["family"].engines_per_scale()


def _prune(state: list[dict], price: Callable[[Family, int], float], top: int,
           out: ScaleSearch) -> None:
    held = sorted((s["row"] for s in state if s["ok"] is not None and not s.get("pruned")),
                  key=lambda r: r["usd_per_hour"])
    if not held:
        return
    overall = held[top - 1]["usd_per_hour"] if 0 < top <= len(held) else math.inf
    per_gpu: dict[str, dict] = {}
    for row in held:
        per_gpu.setdefault(row["hardware"], row)
    for s in state:
        best = per_gpu.get(s["family"].hardware)
        if s["next"] is None or best is None:
            continue
        cheapest_left = price(s["family"], s["fail"] + 1)
        if cheapest_left > best["usd_per_hour"] and cheapest_left > overall:
            out.skipped += 1  # (at least: its search had one more probe to run, or more)
            s["next"], s["pruned"] = None, True
            out.pruned.append((s["family"], best["deployment"]))


def _next_scale(search: dict, max_scale: int) -> int | None:
    low, high = search["fail"], search["ok"]
    if high is None:  # still doubling
        return low * 2 if low * 2 <= max_scale else None
    return (low + high) // 2 if high - low > 1 else None


def cheapest(rows: Sequence[dict], per: str | None = None) -> list[dict]:
    """Rows by price (then p99 TTFT); with `per`, the cheapest row for each value of it."""
    ranked = sorted(rows, key=lambda r: (r["usd_per_hour"], r["p99_ttft_ms"]))
    if per is None:
        return ranked
    best: dict = {}
    for row in ranked:
        best.setdefault(row[per], row)
    return list(best.values())


def simulate_args(row: dict, context: PlanContext) -> list[str]:
    """The `servelab simulate` flags (trace flags aside) that replay one planned deployment
    on its own."""
    dp = row.get("dp", 1)
    size = ["--pd", row["pd"]] if row["pd"] else ["--replicas", str(row["engines"] // dp)]
    dp = ["--data-parallel-size", str(dp), "--enable-expert-parallel"] if dp > 1 else []
    budget = ["--token-budget", str(row["token_budget"])] if row["token_budget"] else []
    caching = [] if context.enable_prefix_caching else ["--no-enable-prefix-caching"]
    return ["--cost", context.cost, "--model", context.model, "--dtype", context.dtype,
            "--hardware", row["hardware"], "--tp", str(row["tp"]), *size, *dp,
            "--router", row["router"],
            "--policy", row["policy"], "--max-num-seqs", str(row["max_num_seqs"]),
            "--block-size", str(context.block_size), "--gpu-memory-utilization",
            f"{context.gpu_memory_utilization:g}", "--kv-link-gbps",
            f"{context.kv_link_gbps:g}", *budget, *caching,
            *(["--max-model-len", str(context.max_model_len)] if context.max_model_len else []),
            *(["--open-loop"] if context.open_loop else [])]
