"""The report's last section, clusters: p99 TTFT against replica count for each router on two
traces, and prefill/decode disaggregation against co-located replicas on equal GPUs."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from itertools import takewhile
from pathlib import Path
from typing import NamedTuple

from servelab.reporting.charts import cluster_charts
from servelab.reporting.sections import Section, default_deployment
from sim.cluster.config import DEFAULT_KV_LINK_GBPS, ClusterConfig
from sim.cluster.router import ROUTERS, RouterConfig
from sim.deployment import DeploymentOptions, build_deployment
from sim.engine.core import Backend
from sim.engine.scheduler_config import SchedulerConfig
from sim.policy_runs import run_deployment
from sim.replay.metrics import summarize
from sim.replay.workload import requests_from_trace
from sim.specs.engine_limits import ENGINE_DEFAULTS
from workloads import Trace, load_bundled
from workloads.transforms import scale_qps

REPLICAS = (1, 2, 4, 8)
CONV_QPS_SCALE = 16.0  # x azure-conv's own rate: one H100 falls far behind
MOONCAKE_MAX_MODEL_LEN = 200_000  # above the longest request, so none is rejected
PD_QPS_SCALES = (4.0, 8.0, 12.0, 16.0)  # x azure-conv's own rate
PD_GPUS = 4  # every P/D comparison point uses this many engines in all
PD_SPLITS = ((1, 3), (2, 2))  # (prefill, decode) engines
PD_ROUTER = "least-requests"
TTFT_TARGET_MS = 2000.0
COMPARE_REPLICAS = 4  # where the routers are compared on mooncake
POLICY = "chunked"
BLOCK_SIZE = ENGINE_DEFAULTS.block_size
DEPLOYMENT = "Llama-3-8B bf16, one H100 per engine (simulated)"
KEPT = ("p99_ttft_ms", "median_ttft_ms", "p99_itl_ms", "median_itl_ms",  # summary keys
        "prefix_cache_hit_rate", "completed", "rejected", "request_throughput")


class Point(NamedTuple):
    """One simulated run: which trace, at what multiple of its rate, on which cluster."""

    trace: str  # "conv" or "mooncake"
    qps_scale: float
    cluster: ClusterConfig | None  # None: one engine


def replicas_cluster(num_replicas: int, router: str) -> ClusterConfig | None:
    """num_replicas co-located engines behind router; None for one (no router to pick)."""
    return None if num_replicas == 1 else ClusterConfig(num_replicas, RouterConfig(router))


def pd_clusters(kv_bytes_per_token: int) -> dict[str, ClusterConfig]:
    """The equal-GPU deployments compared: co-located replicas and each P/D split."""
    router = RouterConfig(PD_ROUTER)
    out = {f"{PD_GPUS} co-located": ClusterConfig(PD_GPUS, router)}
    for prefill, decode in PD_SPLITS:
        assert prefill + decode == PD_GPUS, "P/D splits must use PD_GPUS engines"
        out[f"P/D {prefill}:{decode}"] = ClusterConfig(  # the default 400 Gb/s KV link
            router=router, num_prefill=prefill, num_decode=decode,
            kv_bytes_per_token=kv_bytes_per_token)
    return out


def clusters(out: Path, workers: int | None = None, conv: Trace | None = None,
             mooncake: Trace | None = None, replicas: tuple[int, ...] = REPLICAS,
             pd_scales: tuple[float, ...] = PD_QPS_SCALES) -> Section:
    """p99 TTFT against replicas per router (conv at 16x, mooncake at its rate), and P/D
    against co-located replicas on PD_GPUS engines (conv at several rates)."""
    if COMPARE_REPLICAS not in replicas:
        raise ValueError(f"clusters: replicas {replicas} must include {COMPARE_REPLICAS}")
    backend, num_blocks = default_deployment()
    kv_bytes = build_deployment(DeploymentOptions()).kv_pool.block_bytes // BLOCK_SIZE
    traces = {"conv": conv if conv is not None else load_bundled("azure-conv"),
              "mooncake": mooncake if mooncake is not None else load_bundled(
                  "mooncake-synthetic")}
    configs = {"conv": SchedulerConfig(POLICY, num_blocks, BLOCK_SIZE),
               "mooncake": SchedulerConfig(POLICY, num_blocks, BLOCK_SIZE,
                                           max_model_len=MOONCAKE_MAX_MODEL_LEN)}
    scales = {"conv": CONV_QPS_SCALE, "mooncake": 1.0}
    grid = {(t, r, n): Point(t, scales[t], replicas_cluster(n, r))
            for t in traces for r in ROUTERS for n in replicas}
    deployments = pd_clusters(kv_bytes)
    pd = {(label, x): Point("conv", x, c) for label, c in deployments.items() for x in pd_scales}
    done = run_points({*grid.values(), *pd.values()}, traces, configs, backend, workers)
    data = {"replicas": list(replicas), "routers": list(ROUTERS), "num_blocks": num_blocks,
            "trace_qps_scale": scales, "pd_qps_scales": list(pd_scales),
            "by_router": {t: {r: {str(n): done[grid[t, r, n]] for n in replicas}
                              for r in ROUTERS} for t in traces},
            "by_deployment": {label: {str(x): done[pd[label, x]] for x in pd_scales}
                              for label in deployments},
            **_trace_facts(traces, deployments[f"P/D {PD_SPLITS[0][0]}:{PD_SPLITS[0][1]}"])}
    data["conv_replicas_for_target"] = {r: _first_under(data["by_router"]["conv"][r], replicas)
                                        for r in ROUTERS}
    rates = {str(x): x * data["trace_rate_rps"]["conv"] for x in pd_scales}
    data["pd_rate_under_target_rps"] = {label: _highest_under(by, rates)
                                        for label, by in data["by_deployment"].items()}
    return _section(out, data, traces)


def _trace_facts(traces: dict[str, Trace], pd: ClusterConfig) -> dict:
    """What the text cites about the traces: rates, prompt sizes, one prompt's KV hand-off."""
    mean_prompt = float(traces["conv"].table["prompt_len"].mean())
    return {"trace_rate_rps": {t: (len(trace) - 1) / trace.span_s
                               for t, trace in traces.items()},
            "conv_mean_prompt_tokens": mean_prompt,
            "mooncake_max_prompt_tokens": int(traces["mooncake"].table["prompt_len"].max()),
            "kv_bytes_per_token": pd.kv_bytes_per_token,
            "kv_transfer_ms_mean_prompt": 1e3 * pd.transfer_s(round(mean_prompt))}


def run_points(points: set[Point], traces: dict[str, Trace],
               configs: dict[str, SchedulerConfig], backend: Backend,
               workers: int | None) -> dict[Point, dict]:
    """Each point's summary (the KEPT keys), one process per point up to `workers`."""
    # Longest runs first (mooncake, then low rates: more simulated seconds), so the pool
    # does not end waiting on one long run.
    order = sorted(points, key=lambda p: (p.trace != "mooncake", p.qps_scale, repr(p.cluster)))
    jobs = [(scale_qps(traces[p.trace], p.qps_scale), configs[p.trace], backend, p.cluster)
            for p in order]
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        return {p: simulate_point(*job) for p, job in zip(order, jobs, strict=True)}
    context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(simulate_point, *job) for job in jobs]
        return {p: f.result() for p, f in zip(order, futures, strict=True)}


def simulate_point(trace: Trace, config: SchedulerConfig, backend: Backend,
                   cluster: ClusterConfig | None) -> dict:
    """The KEPT summary keys of one run (a process-pool worker)."""
    result, _ = run_deployment(requests_from_trace(trace), config, backend, cluster)
    summary = summarize(result)
    return {key: summary[key] for key in KEPT}


def _first_under(runs: dict[str, dict], replicas: tuple[int, ...]) -> int | None:
    """The fewest replicas whose p99 TTFT meets the target; None if none does."""
    return next((n for n in replicas if runs[str(n)]["p99_ttft_ms"] <= TTFT_TARGET_MS), None)


def _section(out: Path, data: dict, traces: dict[str, Trace]) -> Section:
    names = {t: f"{trace.name} at {data['trace_qps_scale'][t]:g}x its rate "
                f"({data['trace_rate_rps'][t] * data['trace_qps_scale'][t]:.1f} req/s)"
             for t, trace in traces.items()}
    replicas_finding, pd_finding = _replicas_finding(data), _pd_finding(data)
    subtitle = f"{POLICY}, prefix caching on, {data['num_blocks']:,}-block KV pool per engine"
    paths = [
        cluster_charts.replicas_by_router(data["by_router"], names, TTFT_TARGET_MS,
                                          replicas_finding, f"{subtitle}; {DEPLOYMENT}",
                                          out / "clusters_replicas.png"),
        cluster_charts.pd_vs_colocated(data["by_deployment"], _pd_rates(data), TTFT_TARGET_MS,
                                       pd_finding, f"{traces['conv'].name}, {subtitle}; "
                                       f"{DEPLOYMENT}", out / "clusters_pd.png")]
    tables = [cluster_charts.replicas_table(data["by_router"][t], names[t]) for t in traces]
    body = "\n\n".join([
        _intro(data, names), _replicas_text(data), *tables, _pd_text(data),
        cluster_charts.pd_table(data["by_deployment"], _pd_rates(data)), _reproduce(data)])
    return Section("Clusters: replicas, routers and P/D", f"{replicas_finding}; {pd_finding}",
                   paths, body, data)


def _pd_rates(data: dict) -> list[float]:  # req/s of each P/D point
    return [x * data["trace_rate_rps"]["conv"] for x in data["pd_qps_scales"]]


def _replicas_finding(data: dict) -> str:
    need = {r: n for r, n in data["conv_replicas_for_target"].items() if n is not None}
    target = f"{TTFT_TARGET_MS / 1e3:g} s"
    if need:
        fewest = min(need.values())
        routers = [r for r, n in need.items() if n == fewest]
        routers = "every router" if len(routers) == len(ROUTERS) else ", ".join(routers)
        conv = (f"azure-conv at {CONV_QPS_SCALE:g}x needs {fewest} replicas for p99 TTFT "
                f"under {target} ({routers})")
    else:
        conv = (f"azure-conv at {CONV_QPS_SCALE:g}x keeps p99 TTFT above {target} even at "
                f"{max(data['replicas'])} replicas")
    n = str(COMPARE_REPLICAS)
    rr, pa = (data["by_router"]["mooncake"][r][n] for r in ("round-robin", "prefix-aware"))
    return (f"{conv}; on mooncake at {n} replicas prefix-aware routing takes the cache hit "
            f"rate from {rr['prefix_cache_hit_rate']:.0%} to {pa['prefix_cache_hit_rate']:.0%} "
            f"and p99 TTFT from {rr['p99_ttft_ms'] / 1e3:.1f} s to "
            f"{pa['p99_ttft_ms'] / 1e3:.1f} s against round-robin")


def _pd_finding(data: dict) -> str:
    top = str(data["pd_qps_scales"][-1])
    itl = {label: by[top]["p99_itl_ms"] for label, by in data["by_deployment"].items()}
    colocated = f"{PD_GPUS} co-located"
    within = data["pd_rate_under_target_rps"]
    split = min((k for k in itl if k != colocated), key=itl.__getitem__)
    held = max((k for k in within if k != colocated), key=lambda k: within[k] or 0.0)
    return (f"on {PD_GPUS} GPUs at {_pd_rates(data)[-1]:.0f} req/s P/D {split[4:]} cuts p99 "
            f"ITL from {itl[colocated]:.0f} ms to {itl[split]:.0f} ms, but its prefill pool "
            f"bounds TTFT: p99 TTFT stays under {TTFT_TARGET_MS / 1e3:g} s "
            f"{_up_to(within[held])} with P/D {held[4:]}, {_up_to(within[colocated])} "
            "co-located")


def _up_to(rate_rps: float | None) -> str:
    return "at no rate simulated" if rate_rps is None else f"up to {rate_rps:.0f} req/s"


def _intro(data: dict, names: dict[str, str]) -> str:
    return (
        "Several engines behind a router, each with its own scheduler and KV pool, on one "
        "simulated clock: the router sees each engine's queue (least-requests), its KV use "
        "(least-kv), or also how much of the prompt its prefix cache holds (prefix-aware, "
        "which weighs that against queue and KV). First chart: p99 TTFT against the number "
        "of replicas for each router, on "
        + " and on ".join(names.values())
        + "; one replica is one engine, the same run for every router. Second chart: "
        f"{PD_GPUS} GPUs as {PD_GPUS} co-located replicas or as prefill/decode pools, where "
        "a prefill engine computes the prompt, sends its KV over a "
        f"{DEFAULT_KV_LINK_GBPS:g} Gb/s link and a decode engine produces the output.\n\n"
        f"Simulated: {POLICY} prefill ({ENGINE_DEFAULTS.token_budget:,}-token step budget), prefix "
        f"caching on, {BLOCK_SIZE}-token KV blocks, {data['num_blocks']:,} blocks per engine; "
        f"mooncake with max_model_len {MOONCAKE_MAX_MODEL_LEN:,}; {DEPLOYMENT}.")


def _replicas_text(data: dict) -> str:
    conv, moon = data["by_router"]["conv"], data["by_router"]["mooncake"]
    n, top = str(COMPARE_REPLICAS), str(max(data["replicas"]))
    need = ", ".join(f"{r} {'none' if k is None else k}"
                     for r, k in data["conv_replicas_for_target"].items())
    text = [f"azure-conv carries no prompt contents, so no prefix is ever shared (hit rate "
            f"{conv['round-robin'][n]['prefix_cache_hit_rate']:.0%}) and routers differ only "
            f"in how they balance load. One engine falls behind (p99 TTFT "
            f"{conv['round-robin']['1']['p99_ttft_ms'] / 1e3:.0f} s); the fewest replicas for "
            f"p99 TTFT under {TTFT_TARGET_MS / 1e3:g} s: {need}."]
    rr, kv = conv["round-robin"][n]["p99_ttft_ms"], conv["least-kv"][n]["p99_ttft_ms"]
    if kv > 1.5 * rr:
        text.append(f"The least-kv router does worse than round-robin ({kv / 1e3:.1f} s against "
                    f"{rr / 1e3:.1f} s at {n} replicas): it ranks replicas by the KV their "
                    "requests hold, which a request takes only once its replica admits it, so "
                    "the arrivals between two steps all go to the same replica.")
    rr, pa = moon["round-robin"][n], moon["prefix-aware"][n]
    text.append(f"On mooncake, whose requests share prefixes, prefix-aware routing sends a "
                f"prompt where its prefix is cached: at {n} replicas the hit rate is "
                f"{pa['prefix_cache_hit_rate']:.0%} against {rr['prefix_cache_hit_rate']:.0%} "
                f"with round-robin, median TTFT {pa['median_ttft_ms'] / 1e3:.2f} s against "
                f"{rr['median_ttft_ms'] / 1e3:.2f} s and p99 TTFT "
                f"{pa['p99_ttft_ms'] / 1e3:.1f} s against {rr['p99_ttft_ms'] / 1e3:.1f} s.")
    best = min(moon, key=lambda r: moon[r][n]["p99_ttft_ms"])
    if best != "prefix-aware":
        text.append(f"Its p99 is not the lowest: {best}, blind to the cache, reaches "
                    f"{moon[best][n]['p99_ttft_ms'] / 1e3:.1f} s, as the prefix-aware router "
                    "trades some balance for hits and the tail is set by queueing.")
    loaded = min(moon[r][top]["p99_ttft_ms"] for r in ("least-requests", "least-kv"))
    if moon["round-robin"][top]["p99_ttft_ms"] > 2 * loaded:
        text.append(f"Round-robin ignores load, and mooncake's prompts run to "
                    f"{data['mooncake_max_prompt_tokens']:,} tokens: at {top} replicas its "
                    f"p99 TTFT is {moon['round-robin'][top]['p99_ttft_ms'] / 1e3:.1f} s "
                    f"against {loaded / 1e3:.1f} s for the best load-aware router, as a "
                    "replica busy with a long prompt keeps getting its turn.")
    return " ".join(text)


def _pd_text(data: dict) -> str:
    itl = {label: [s["p99_itl_ms"] for s in by.values()]
           for label, by in data["by_deployment"].items()}
    colocated = itl.pop(f"{PD_GPUS} co-located")
    split = [x for values in itl.values() for x in values]
    holds = "; ".join(f"{label} {_up_to(r)}"
                      for label, r in data["pd_rate_under_target_rps"].items())
    return (
        "P/D takes prefill out of the decode engines' steps: p99 ITL is "
        f"{min(split):.0f}-{max(split):.0f} ms under P/D against "
        f"{min(colocated):.0f}-{max(colocated):.0f} ms co-located, where a step can carry a "
        f"prefill chunk of up to {ENGINE_DEFAULTS.token_budget:,} tokens next to the decodes. The "
        "price is TTFT: every prompt is computed in the prefill pool, a quarter or half of the "
        f"GPUs, so that pool's size bounds the rate it keeps up with. p99 TTFT stays under "
        f"{TTFT_TARGET_MS / 1e3:g} s for {holds}. The KV hand-off itself is cheap: a mean "
        f"azure-conv prompt ({data['conv_mean_prompt_tokens']:,.0f} tokens, "
        f"{data['kv_bytes_per_token'] / 1024:.0f} KiB of KV per token) crosses the "
        f"{DEFAULT_KV_LINK_GBPS:g} Gb/s link in {data['kv_transfer_ms_mean_prompt']:.1f} ms.")


def _highest_under(by_scale: dict[str, dict], rates: dict[str, float]) -> float | None:
    """The highest rate up to which every simulated rate meets the p99 TTFT target."""
    met = list(takewhile(lambda x: by_scale[x]["p99_ttft_ms"] <= TTFT_TARGET_MS, by_scale))
    return rates[met[-1]] if met else None


def _reproduce(data: dict) -> str:
    n = COMPARE_REPLICAS
    scale = data["pd_qps_scales"][len(data["pd_qps_scales"]) // 2 - 1]
    split = "{}:{}".format(*PD_SPLITS[-1])
    return (
        "To rerun one point (the tables' numbers; prefix caching is on by default):\n\n"
        f"    servelab simulate --trace azure-conv --qps-scale {CONV_QPS_SCALE:g} --policy "
        f"{POLICY} --replicas {n} --router least-requests\n"
        f"    servelab simulate --trace mooncake-synthetic --policy {POLICY} --max-model-len "
        f"{MOONCAKE_MAX_MODEL_LEN} --replicas {n} --router prefix-aware\n"
        f"    servelab simulate --trace azure-conv --qps-scale {scale:g} --policy {POLICY} "
        f"--pd {split} --router {PD_ROUTER}")
