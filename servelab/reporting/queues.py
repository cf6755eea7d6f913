"""Report section: who goes first. Queue orders under overload (fair against a flooding
tenant, priority with aging, SJF against FCFS) and preemption by swap against recompute.
This module runs the experiments and states the findings; queue_charts shows the numbers."""

from __future__ import annotations

import bisect
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from servelab.reporting.charts import queue_charts as show
from servelab.reporting.charts.queue_charts import (
    NO_CACHE,
    SWAP,
    WITH_CACHE,
    priority_label,
    sjf_label,
)
from servelab.reporting.sections import DEPLOYMENT, Section, default_deployment
from sim.cost.roofline import AnalyticCostModel
from sim.engine.core import Backend
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import DEFAULT_QUEUE_AGING_S, SchedulerConfig
from sim.engine.step import Engine
from sim.replay.metrics import summarize
from sim.replay.simulation import run_trace
from sim.replay.workload import requests_from_trace
from sim.specs.engine_limits import ENGINE_DEFAULTS, kv_blocks
from sim.specs.hardware import GiB
from workloads import Trace, load_bundled, open_trace
from workloads.transforms import head, scale_qps

POLICY = "chunked"
BLOCK_SIZE = ENGINE_DEFAULTS.block_size
MODEL = "llama-3-8b"
# Experiments 1-2: one A100 with at most 32 running requests serves about 15.5 req/s of these
# ~600-token requests, so 20 req/s overloads it from the start and a run costs ~1 s of CPU.
SMALL_HARDWARE, SMALL_MAX_SEQS = "a100-80gb", 32
SMALL_DEPLOYMENT = "Llama-3-8B bf16 on one A100-80GB, at most 32 running requests (simulated)"
AGINGS_S = (DEFAULT_QUEUE_AGING_S, 20.0)  # the default bound, one the backlog outgrows
SJF_QPS_SCALE = 3.5  # x the first requests' 4.9 req/s: ~17 req/s against the ~14 one H100 serves
SJF_NOISES = (0.0, 0.5, 1.5)  # log-space std of the output-length guess (0: an oracle)
SWAP_HARDWARE = ("a100-80gb", "h100")  # PCIe 32 and 64 GB/s per direction
SWAP_OUTPUT = 512  # tokens; with the longest prompt, 7,680 + 512 = Llama-3-8B's 8,192
SWAP_POOL_REQUESTS = 8  # the KV pool holds this many requests at full length
# Prompt tokens arriving per second (rate = this / prompt length): above what either GPU
# prefills, so the pool stays full and decodes keep evicting the newest request.
SWAP_PROMPT_TOKENS_PER_S = 51_200
SWAP_SPACE_GIB = 32.0  # host pool: 4x the largest device pool, so no swap falls back
PREEMPTIONS = {NO_CACHE: ("recompute", False), WITH_CACHE: ("recompute", True),
               SWAP: ("swap", True)}  # label -> (preemption, prefix caching)
# Summary keys kept per run (the class tables only exist with several tenants/priorities).
KEPT = ("completed", "rejected", "request_throughput", "median_ttft_ms", "p99_ttft_ms",
        "mean_e2el_ms", "preemptions", "tenants", "priorities", "jain_fairness_index")


@dataclass(frozen=True)
class QueuePlan:
    """How big each experiment is (the tests run a smaller one)."""

    flood_requests: int = 3000  # at 20 req/s; the light tenant sends a tenth at 2 req/s
    priority_requests: int = 3000  # at 20 req/s, a fifth of them high priority
    sjf_requests: int = 4000  # the first of azure-conv
    swap_requests: int = 200  # per prompt length
    swap_prompts: tuple[int, ...] = (512, 1024, 2048, 4096, 7680)


class Job(NamedTuple):
    """One simulated run: a trace through one scheduler on one deployment."""

    trace: Trace
    config: SchedulerConfig
    backend: Backend


def tenant_spec(flood_requests: int) -> str:
    """A flood of ~600-token prompts at 20 req/s and a light tenant at a tenth of its rate."""
    return (f"synthetic:tenant=flood,n={flood_requests},rate=20,prompt=lognormal(512,0.5),"
            f"output=fixed(64);tenant=light,n={flood_requests // 10},rate=2,"
            f"prompt=fixed(256),output=fixed(64)")


def priority_spec(requests: int) -> str:
    """20 req/s of one shape: a fifth at priority 0 (high), the rest at priority 1."""
    high = requests // 5
    shape = "prompt=lognormal(512,0.5),output=fixed(64)"
    return (f"synthetic:tenant=high,n={high},rate=4,{shape},priority=0;"
            f"tenant=low,n={requests - high},rate=16,{shape},priority=1")


def swap_spec(requests: int, prompt: int) -> str:
    """Fixed prompts and outputs, arriving faster than the GPU prefills them."""
    rate = SWAP_PROMPT_TOKENS_PER_S / prompt
    return (f"synthetic:n={requests},rate={rate:g},prompt=fixed({prompt}),"
            f"output=fixed({SWAP_OUTPUT})")


def swap_pool_blocks(prompt: int) -> int:
    """The undersized KV pool of a prompt length: SWAP_POOL_REQUESTS requests at full length."""
    return SWAP_POOL_REQUESTS * -(-(prompt + SWAP_OUTPUT) // BLOCK_SIZE)


def swap_space_blocks(backend: AnalyticCostModel) -> int:
    """SWAP_SPACE_GIB in KV blocks, as `--swap-space-gib` converts it."""
    block_bytes = backend.model.kv_bytes_per_token(backend.dtype_bytes) * BLOCK_SIZE
    return kv_blocks(SWAP_SPACE_GIB * GiB, block_bytes)


def token_costs(backend: AnalyticCostModel) -> dict[str, float]:
    """Per token: microseconds to recompute it (2 x parameters FLOPs at the achieved FLOP/s,
    attention left out) and to swap it out and back (2 x its KV bytes over PCIe)."""
    flops_s = backend.hardware.peak_flops * backend.flops_efficiency
    link_bytes_s = backend.hardware.host_link_bytes_s
    return {"recompute_us": 2 * backend.model.num_params / flops_s * 1e6,
            "swap_us": 2 * backend.gpu_kv_bytes_per_token / link_bytes_s * 1e6,
            "kv_kib_per_token": backend.gpu_kv_bytes_per_token / 1024,
            "pcie_gb_s": link_bytes_s / 1e9}


def queue_orders(out: Path, workers: int | None = None, plan: QueuePlan | None = None
                 ) -> Section:
    """Fair and priority queues against FCFS under overload, SJF against FCFS under
    continuous and chunked batching, and swap against recompute as prompts grow."""
    plan = plan or QueuePlan()
    small = default_deployment(SMALL_HARDWARE)[0]
    sjf = scale_qps(head(load_bundled("azure-conv"), plan.sjf_requests), SJF_QPS_SCALE)
    jobs = {**_sjf_jobs(sjf), **_swap_jobs(plan), **_tenant_jobs(plan, small),
            **_priority_jobs(plan, small)}  # the longest runs first: the pool ends sooner
    data = {"setup": {
        "plan": asdict(plan), "agings_s": list(AGINGS_S), "sjf_noises": list(SJF_NOISES),
        "sjf_qps_scale": SJF_QPS_SCALE, "sjf_rate_rps": (len(sjf) - 1) / sjf.span_s,
        "swap_output": SWAP_OUTPUT, "swap_pool_requests": SWAP_POOL_REQUESTS,
        "swap_prompt_tokens_per_s": SWAP_PROMPT_TOKENS_PER_S, "swap_space_gib": SWAP_SPACE_GIB,
        "swap_pool_blocks": {str(p): swap_pool_blocks(p) for p in plan.swap_prompts},
        "costs": {hw: token_costs(AnalyticCostModel.preset(MODEL, hw))
                  for hw in SWAP_HARDWARE}}}
    data.update(_nest(run_jobs(jobs, workers)))
    return _section(out, data, plan)


def _small_config(**settings) -> SchedulerConfig:
    blocks = default_deployment(SMALL_HARDWARE)[1]
    return SchedulerConfig(POLICY, blocks, max_num_seqs=SMALL_MAX_SEQS, **settings)


def _tenant_jobs(plan: QueuePlan, backend: Backend) -> dict[tuple, Job]:
    trace = open_trace(tenant_spec(plan.flood_requests))
    return {("tenants", q): Job(trace, _small_config(queue=q), backend)
            for q in ("fcfs", "fair")}


def _priority_jobs(plan: QueuePlan, backend: Backend) -> dict[tuple, Job]:
    trace = open_trace(priority_spec(plan.priority_requests))
    configs = {"fcfs": _small_config()}
    configs.update({priority_label(a): _small_config(queue="priority", queue_aging_s=a)
                    for a in AGINGS_S})
    return {("priorities", label): Job(trace, c, backend) for label, c in configs.items()}


def _sjf_jobs(trace: Trace) -> dict[tuple, Job]:
    backend, blocks = default_deployment()  # one H100
    jobs = {}
    for policy in ("continuous", "chunked"):
        jobs["sjf", policy, "fcfs"] = Job(trace, SchedulerConfig(policy, blocks), backend)
        for noise in SJF_NOISES:
            config = SchedulerConfig(policy, blocks, queue="sjf", sjf_noise=noise)
            jobs["sjf", policy, sjf_label(noise)] = Job(trace, config, backend)
    return jobs


def _swap_jobs(plan: QueuePlan) -> dict[tuple, Job]:
    jobs = {}
    for hardware in SWAP_HARDWARE:
        backend = default_deployment(hardware)[0]
        sizing = AnalyticCostModel.preset(MODEL, hardware)
        for prompt in plan.swap_prompts:
            trace = open_trace(swap_spec(plan.swap_requests, prompt))
            for label, (mode, caching) in PREEMPTIONS.items():
                host = swap_space_blocks(sizing) if mode == "swap" else 0
                config = SchedulerConfig(POLICY, swap_pool_blocks(prompt), preemption=mode,
                                         enable_prefix_caching=caching, swap_space_blocks=host)
                jobs["swap", hardware, str(prompt), label] = Job(trace, config, backend)
    return jobs


def run_jobs(jobs: dict[tuple, Job], workers: int | None) -> dict[tuple, dict]:
    """Each job's numbers (simulate_job), one process per job up to `workers`."""
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        return {key: simulate_job(job) for key, job in jobs.items()}
    context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {key: pool.submit(simulate_job, job) for key, job in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


def simulate_job(job: Job) -> dict:
    """The KEPT summary keys of one run, plus the longest time a request was overtaken, the
    evictions that swapped, and the prefill tokens computed again after preemptions."""
    requests = requests_from_trace(job.trace)
    engine = Engine(Scheduler(job.config), job.backend)
    result = run_trace(requests, engine)
    summary = summarize(result)
    out = {key: summary[key] for key in KEPT if key in summary}
    first = [np.nan if r.first_scheduled_s is None else r.first_scheduled_s for r in requests]
    out["longest_overtaken_s"] = longest_overtaken_s(
        np.array([r.arrival_s for r in requests]), np.array(first))
    out["swapped_out"] = engine.scheduler.num_swapped_out
    # Synthetic prompts share no prefix: prefill tokens beyond the prompts are recomputed.
    out["recomputed_tokens"] = (sum(step.prefill_tokens for step in result.steps)
                                - sum(r.prompt_len for r in requests))
    return out


def longest_overtaken_s(arrival_s: np.ndarray, first_scheduled_s: np.ndarray) -> float:
    """The longest time from a request's arrival to the last first admission of a request
    that arrived after it and was admitted before it (0: nobody was overtaken). Aging
    bounds it: once a request has waited aging_s, no later arrival goes before it."""
    admitted = ~np.isnan(first_scheduled_s)
    order = np.argsort(arrival_s[admitted], kind="stable")
    arrival, first = arrival_s[admitted][order], first_scheduled_s[admitted][order]
    later: list[float] = []  # first admissions of the requests that arrived after, sorted
    longest = 0.0
    for i in range(len(arrival) - 1, -1, -1):
        j = bisect.bisect_left(later, first[i])  # admitted strictly before request i
        if j:
            longest = max(longest, later[j - 1] - arrival[i])
        bisect.insort(later, first[i])
    return float(longest)


def _nest(done: dict[tuple, dict]) -> dict:
    """{(a, b, c): x} -> {a: {b: {c: x}}}."""
    data: dict = {}
    for key, value in done.items():
        node = data
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return data


# ---- findings and the section ---------------------------------------------------------------

def findings(data: dict) -> dict[str, str]:
    """One clause per experiment, computed from its numbers."""
    light = {q: data["tenants"][q]["tenants"]["light"]["p99_ttft_ms"] for q in ("fcfs", "fair")}
    high = {run: s["priorities"]["0"]["p99_ttft_ms"] for run, s in data["priorities"].items()}
    fcfs, best = data["sjf"]["chunked"]["fcfs"], data["sjf"]["chunked"][sjf_label(0)]
    aging = AGINGS_S[0]
    tail = (f"pushes its p99 to the {aging:g} s aging bound"
            if best["p99_ttft_ms"] >= 0.95e3 * aging
            else f"moves its p99 from {show.fmt_s(fcfs['p99_ttft_ms'])} to "
                 f"{show.fmt_s(best['p99_ttft_ms'])}")
    gap = show.swap_gap(data["swap"])
    return {
        "tenants": (f"fair queueing cuts a light tenant's p99 TTFT from {show.fmt_s(light['fcfs'])}"
                    f" to {show.fmt_s(light['fair'])}"),
        "priorities": (f"priority cuts the high class's from {show.fmt_s(high['fcfs'])} to "
                       f"{show.fmt_s(high[priority_label(AGINGS_S[0])])} "
                       f"({show.fmt_s(high[priority_label(AGINGS_S[1])])} with {AGINGS_S[1]:g} s "
                       "aging)"),
        "sjf": (f"SJF takes chunked's median TTFT from {show.fmt_s(fcfs['median_ttft_ms'])} to "
                f"{show.fmt_s(best['median_ttft_ms'])} but {tail}"),
        "swap": (f"recompute takes {gap.cache_off:.1f}x swap's mean E2EL ({gap.where()}) with "
                 f"the prefix cache off, at most {gap.cache_on - 1:.0%} more with it on"),
    }


def _section(out: Path, data: dict, plan: QueuePlan) -> Section:
    words = findings(data)
    paths = [
        show.tenants_and_priorities(
            data["tenants"], data["priorities"], f"{words['tenants']}; {words['priorities']}",
            f"{POLICY} prefill, {SMALL_DEPLOYMENT}", out / "queue_tenants_priorities.png"),
        show.sjf(data["sjf"], AGINGS_S[0], words["sjf"],
                 f"azure-conv, first {plan.sjf_requests:,} requests at "
                 f"{data['setup']['sjf_rate_rps']:.1f} req/s; {DEPLOYMENT}", out / "queue_sjf.png"),
        show.swap(data["swap"], words["swap"],
                  f"{plan.swap_requests} requests per prompt length, {SWAP_OUTPUT}-token "
                  f"outputs, a KV pool of {SWAP_POOL_REQUESTS} whole requests; {POLICY} "
                  "prefill, Llama-3-8B bf16 (simulated)", out / "queue_swap.png")]
    intro = (
        "Which waiting request is admitted next (`--queue`) and what eviction does with a "
        "victim's KV (`--preemption`) are settings apart from the batching policy "
        "(docs/queues.md). Queue order only matters when there is a queue, so every experiment "
        f"sends more than the engine serves. The first two run on {SMALL_DEPLOYMENT}, with "
        f"{POLICY} prefill; SJF on the default deployment; swap on an A100 and an H100 with "
        "an undersized KV pool.")
    body = [intro, show.tenant_text(data),
            show.class_table(data["tenants"], "tenants", {}), show.priority_text(data),
            show.class_table(data["priorities"], "priorities", {"0": "high", "1": "low"}),
            show.sjf_text(data), show.sjf_table(data["sjf"]), show.swap_text(data),
            show.swap_table(data["swap"], data["setup"]["swap_pool_blocks"]),
            _reproduce(plan, show.swap_gap(data["swap"]))]
    return Section("Who goes first: queue orders and preemption by swap",
                   "Under overload, " + "; ".join(words.values()), paths, "\n\n".join(body),
                   data)


def _reproduce(plan: QueuePlan, gap: show.SwapGap) -> str:
    small = f"--policy {POLICY} --hardware {SMALL_HARDWARE} --max-num-seqs {SMALL_MAX_SEQS}"
    return "\n".join([
        "One point of each experiment, reproduced (`--queue fcfs` or `--preemption recompute` "
        "for its baseline):", "",
        f"    servelab simulate --trace '{tenant_spec(plan.flood_requests)}' {small} --queue fair",
        f"    servelab simulate --trace '{priority_spec(plan.priority_requests)}' {small} "
        f"--queue priority --queue-aging-s {AGINGS_S[1]:g}",
        f"    servelab simulate --trace azure-conv --max-requests {plan.sjf_requests} "
        f"--qps-scale {SJF_QPS_SCALE:g} --policy {POLICY} --queue sjf --sjf-noise 0.5",
        f"    servelab simulate --trace '{swap_spec(plan.swap_requests, int(gap.prompt))}' "
        f"--policy {POLICY} --hardware {gap.hardware} --num-blocks "
        f"{swap_pool_blocks(int(gap.prompt))} "
        f"--preemption swap --swap-space-gib {SWAP_SPACE_GIB:g}"])
