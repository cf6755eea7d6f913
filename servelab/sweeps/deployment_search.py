"""The deployment search behind `servelab plan`: the cheapest deployments that hold a latency
SLO on a trace (capacity planning).

A family fixes the GPU, tensor-parallel degree, router, P/D ratio and engine limits (those
it leaves unset are vLLM's defaults for its GPU, as `vllm serve` there would run); its
scale is the number of replicas (co-located) or of P:D groups (scale x P prefill and
scale x D decode engines). The planner finds each family's smallest scale meeting the SLO
at the trace's rate (latency falls as engines are added: doubling from 1, then bisection),
prices it in GPU-hours, and then finds the highest rate the cheapest ones hold. Probes run
through a sweep runner, one per worker in flight, so a pool works on many families at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from servelab.sweeps.grid import CapacitySlo, Runner, replay_summary
from servelab.sweeps.stream import Stream, as_stream
from sim.cluster.config import DEFAULT_KV_LINK_GBPS, ClusterConfig
from sim.cluster.router import RouterConfig
from sim.cost.roofline import AnalyticCostModel
from sim.deployment import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    Deployment,
    DeploymentOptions,
    build_deployment,
)
from sim.engine.scheduler_config import VLLM_POLICY, SchedulerConfig
from sim.engine.speculation.config import SpeculativeConfig
from sim.pricing import DEFAULT_COST
from sim.specs.engine_limits import ENGINE_DEFAULTS
from sim.specs.hardware import gpu_hour_usd
from workloads.trace import Trace
from workloads.transforms import scale_qps


@dataclass(frozen=True)
class Family:
    """Everything about a deployment but how many engines it has."""

    hardware: str
    tp: int = 1
    router: str = "least-requests"
    pd: tuple[int, int] | None = None  # prefill:decode engines per group; None: co-located
    policy: str = "chunked"
    # Engine limits; None: vLLM's default for the family's GPU (vllm_server_limits), the
    # budget chunked prefill's (a policy prefilling whole prompts takes max_model_len).
    max_num_seqs: int | None = None
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
class DeploymentProbe:
    """A family at one scale and one rate: what one simulation prices."""

    family: Family
    scale: int
    qps_scale: float = 1.0
    # Stop the run once it certainly misses this SLO (sim.replay.verdict); None: run to the end.
    verdict: CapacitySlo | None = None


@dataclass(frozen=True)
class SearchContext:
    """What every probe shares: the trace (at its own rate), the model, the SLO, prices."""

    trace: Trace
    slo: CapacitySlo
    model: str = "llama-3-8b"
    dtype: str = "bf16"
    prices: dict[str, float] = field(default_factory=dict)  # overrides, $ per GPU-hour
    block_size: int = ENGINE_DEFAULTS.block_size
    max_model_len: int | None = None  # None: the model's whole context (vLLM's default)
    kv_link_gbps: float = DEFAULT_KV_LINK_GBPS
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    cost: str = DEFAULT_COST  # what prices steps: a --cost value (sim.pricing.COSTS)
    open_loop: bool = False  # sessions' turns at their written times, not closed-loop
    quantization: str | None = None  # vLLM's --quantization (fp8), for every deployment
    kv_cache_dtype: str = "auto"  # vLLM's --kv-cache-dtype, for every deployment
    speculative: SpeculativeConfig | None = None  # --speculative-config, for every engine

    def resolved(self, family: Family) -> Deployment:
        """One engine of the family as a Deployment (its cost model, its KV pool sized for
        its limits, vLLM's limits for its GPU where the family leaves them unset)."""
        return build_deployment(DeploymentOptions(
            self.model, family.hardware, self.dtype, family.tp, family.dp,
            expert_parallel=family.dp > 1, block_size=self.block_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_batched_tokens=family.token_budget, max_num_seqs=family.max_num_seqs,
            vllm_defaults=True, cost=self.cost, quantization=self.quantization,
            kv_cache_dtype=self.kv_cache_dtype))

    def scheduler_config(self, family: Family, deployment: Deployment | None = None
                         ) -> SchedulerConfig:
        """Each engine's scheduler: the family's limits, vLLM's defaults for its GPU where
        unset (`deployment`: the family's, resolved again when None)."""
        deployment = deployment or self.resolved(family)
        limits = deployment.engine_limits
        budget = family.token_budget
        if budget is None and family.policy == VLLM_POLICY:  # vLLM's budget is chunked's
            budget = limits.token_budget
        return SchedulerConfig(
            policy=family.policy, num_blocks=deployment.kv_pool.num_blocks,
            block_size=self.block_size, max_num_seqs=family.max_num_seqs or limits.max_num_seqs,
            max_model_len=self.max_model_len or deployment.max_model_len, token_budget=budget,
            enable_prefix_caching=self.enable_prefix_caching)

    def usd_per_hour(self, family: Family, scale: int) -> float:
        """What the family's deployment of that scale costs an hour (all of its GPUs)."""
        return scale * family.engines_per_scale() * family.tp * gpu_hour_usd(
            family.hardware, self.prices)

    def backend(self, family: Family) -> AnalyticCostModel:
        return self.resolved(family).cost_model

    def deployment(self, point: DeploymentProbe) -> tuple[AnalyticCostModel, SchedulerConfig,
                                                     ClusterConfig]:
        """The cost model, each engine's scheduler config and the cluster of a point."""
        family = point.family
        deployment = self.resolved(family)
        spec = deployment.model
        backend, speculative, _ = deployment.speculative_pricing(self.speculative)
        config = replace(self.scheduler_config(family, deployment), speculative=speculative)
        prefill, decode = (0, 0) if family.pd is None else family.pd
        cluster = ClusterConfig(
            num_replicas=point.scale * family.dp if family.pd is None else 1,
            router=RouterConfig(family.router), num_prefill=prefill * point.scale,
            num_decode=decode * point.scale, kv_link_gbps=self.kv_link_gbps,
            kv_bytes_per_token=spec.kv_bytes_per_token(deployment.cost_model.dtype_bytes))
        return backend, config, cluster


def run_probe(context: SearchContext, point: DeploymentProbe) -> dict:
    """Simulate one point; its row: the deployment, its price, the rate, the summary."""
    backend, config, cluster = context.deployment(point)
    trace = context.trace
    if point.qps_scale != 1:
        trace = scale_qps(trace, point.qps_scale)
    summary, stopped_s = replay_summary(trace, config, backend, cluster, point.verdict,
                                        context.open_loop)
    family = point.family
    gpus = cluster.num_engines * family.tp
    row = {key: value for key, value in asdict(family).items() if key != "pd"}
    row.update(engine_settings(config))  # the limits it ran with, vLLM's where unset
    row.update(
        deployment=family.label(),
        pd=f"{cluster.num_prefill}:{cluster.num_decode}" if cluster.disaggregated else "",
        scale=point.scale, engines=cluster.num_engines, gpus=gpus,
        usd_per_hour=context.usd_per_hour(family, point.scale),
        qps_scale=point.qps_scale, num_blocks=config.num_blocks,
        rate_rps=len(trace) / trace.span_s if trace.span_s > 0 else math.inf,
        stopped_s=stopped_s)
    row.update(summary)
    row["meets_slo"] = context.slo.met(row)
    return row


def engine_settings(config: SchedulerConfig) -> dict[str, int | None]:
    """The engine limits a scheduler runs with, in vLLM's names (token_budget: as given to
    the scheduler, None where the policy's default applies; max_num_batched_tokens: the
    budget in force)."""
    return {"max_num_seqs": config.max_num_seqs, "token_budget": config.token_budget,
            "max_num_batched_tokens": config.budget, "max_model_len": config.max_model_len}


def fitting_families(context: SearchContext, families: Sequence[Family]
                     ) -> tuple[list[Family], list[str]]:
    """The families whose model fits their GPUs, and a line for each one left out; a family
    whose limits contradict each other (given ones against its GPU's defaults) is an error."""
    kept, skipped = [], []
    for family in families:
        try:
            deployment = context.resolved(family)
        except ValueError as exc:
            skipped.append(f"{family.label()}: {exc}")
            continue
        try:
            context.scheduler_config(family, deployment)
        except ValueError as exc:
            raise ValueError(f"{family.label()}: {exc}") from None
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


def smallest_scales(runner: Runner | Stream, families: Sequence[Family], slo: CapacitySlo,
                    max_engines: int, stop_early: bool = True,
                    price: Callable[[Family, int], float] | None = None,
                    top: int = 0, batch: int | None = None,
                    span_s: float | None = None) -> ScaleSearch:
    """Each family's smallest scale meeting the SLO (doubling, then bisection: a family
    that holds at a scale holds at every larger one). stop_early: each probe stops once it
    certainly misses the SLO (the same verdicts). With `price` ($/hour of a family at a
    scale), a family is pruned once its cheapest scale not known to fail is dearer than
    the cheapest holding deployment of its GPU and than the top-th cheapest holding one:
    it could then enter neither `cheapest` list; for the same reason no probe is dearer
    than both (a holder there is bisected down from it, a failure prunes the family).

    `batch` probes (default 1) are in flight at once, one per family, each started as
    another ends (a runner with submit and wait; a plain one runs each as it starts);
    with price, the cheapest probe wanted starts first, so cheap holders are found (and
    dear families pruned) before dear probes run. With span_s (the trace's), a family grows
    past a failed scale by less than double the longer that probe ran (_growth); the
    answers are the same, the scales probed on the way differ."""
    verdict = slo if stop_early else None
    stream = as_stream(runner)
    state = [{"family": f, "fail": 0, "ok": None, "next": 1} for f in families]
    out = ScaleSearch([], [])
    in_flight: dict[Any, tuple[dict, int]] = {}  # handle -> (family's search, its scale)
    while True:
        if price is not None:
            _prune(state, price, top, out)
        wanted = [s for s in state if s["next"] is not None]
        if price is not None:
            wanted.sort(key=lambda s: price(s["family"], s["next"]))
        for s in wanted[:max((batch or 1) - len(in_flight), 0)]:
            handle = stream.submit(DeploymentProbe(s["family"], s["next"], verdict=verdict))
            in_flight[handle] = (s, s["next"])
            s["next"] = None  # (none while this probe runs)
        if not in_flight:
            break
        for handle, row in stream.wait(list(in_flight)):
            s, scale = in_flight.pop(handle)
            out.probes.append(row)
            if row["meets_slo"]:
                s["ok"], s["row"] = scale, row
            else:
                s["fail"] = scale
            s["next"] = _next_scale(s, _max_scale(s, max_engines), _growth(row, span_s))
    out.met = [s["row"] for s in state if s["ok"] is not None and not s.get("pruned")]
    # In the families' order, whichever order their probes happened to finish in.
    rank = {id(s["family"]): i for i, s in enumerate(state)}
    out.pruned.sort(key=lambda pruned: rank[id(pruned[0])])
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
        # A holding scale dearer than this enters neither list: probe no higher (the search
        # stays between the highest failing scale and the lowest holding one, as it must).
        limit = max(best["usd_per_hour"], overall)
        if price(s["family"], s["fail"] + 1) > limit:
            out.skipped += 1  # (at least: its search had one more probe to run, or more)
            s["next"], s["pruned"] = None, True
            out.pruned.append((s["family"], best["deployment"]))
            continue
        while price(s["family"], s["next"]) > limit:
            s["next"] -= 1


def _next_scale(search: dict, max_scale: int, growth: float = 1.0) -> int | None:
    """The next scale to probe: growing by up to `growth` times the highest failing one
    until one holds (no further than doubling from 1 reaches), then bisecting."""
    low, high = search["fail"], search["ok"]
    if high is None:  # still growing
        reach = 1 << (max_scale.bit_length() - 1) if max_scale >= 1 else 0
        return min(low + max(round(low * growth), 1), reach) if low < reach else None
    return (low + high) // 2 if high - low > 1 else None


def _growth(row: dict, span_s: float | None) -> float:
    """How much to grow a family's scale past a probe that failed: double (1.0) unless the
    probe ran long before it certainly failed, which says the scale fell only a little short
    of holding; a holder above it would be run to the end for nothing (the costliest run of
    the search), so the step shrinks with the part of the trace the probe got through."""
    if span_s is None or not span_s > 0:
        return 1.0
    stopped_s = row.get("stopped_s")
    done = 1.0 if stopped_s is None else min(stopped_s / span_s, 1.0)
    return (1.0 - done) ** 2


def cheapest(rows: Sequence[dict], per: str | None = None) -> list[dict]:
    """Rows by price (then p99 TTFT); with `per`, the cheapest row for each value of it."""
    ranked = sorted(rows, key=lambda r: (r["usd_per_hour"], r["p99_ttft_ms"]))
    if per is None:
        return ranked
    best: dict = {}
    for row in ranked:
        best.setdefault(row[per], row)
    return list(best.values())


def simulate_args(row: dict, context: SearchContext) -> list[str]:
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
            *(["--open-loop"] if context.open_loop else []),
            *(["--quantization", context.quantization] if context.quantization else []),
            *(["--speculative-config", json.dumps(context.speculative.as_record())]
              if context.speculative else []),
            *(["--kv-cache-dtype", context.kv_cache_dtype]
              if context.kv_cache_dtype != "auto" else [])]
