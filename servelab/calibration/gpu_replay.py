"""Replay LLMServingSim's four real vLLM runs through servelab's simulator with the fitted
GPU cost model: same arrivals, lengths and engine arguments (meta.json) resolved into a
Deployment as the CLI resolves vLLM's flags, vLLM's KV pool."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from servelab.calibration.gpu_profiles import DATA_DIR, LSS_GPUS, LSS_MODELS
from sim.cluster.config import ClusterConfig
from sim.cluster.dp_lockstep import run_lockstep
from sim.cluster.router import RouterConfig
from sim.cluster.run import run_cluster
from sim.cost.gpu_cost import GpuCostModel
from sim.deployment import Deployment, DeploymentOptions, build_deployment
from sim.engine.core import Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.pricing import DEFAULT_COST
from sim.replay.metrics import summarize
from sim.replay.simulation import run_trace

RUNS_DIR = DATA_DIR / "llmservingsim" / "bench" / "examples"
# summary.txt row label -> servelab summary key.
METRICS = {"TTFT Mean": "mean_ttft_ms", "TTFT P99": "p99_ttft_ms", "TPOT Mean": "mean_tpot_ms",
           "TPOT P99": "p99_tpot_ms", "Latency Mean": "mean_e2el_ms",
           "Latency P99": "p99_e2el_ms"}


@dataclass(frozen=True)
class VllmRun:
    """One measured run: where, what, its engine arguments and the peer's table."""

    name: str  # GPU/model folder
    gpu: str
    model: str
    engine_kwargs: dict
    num_gpu_blocks: int | None  # from meta.json when vLLM recorded it
    requests: tuple[tuple[float, int, int], ...]  # (arrival_s from 0, prompt, output)
    vllm: dict[str, float]  # summary key -> measured (as LLMServingSim's table states it)
    peer: dict[str, float]  # summary key -> LLMServingSim's prediction
    vllm_version: str | None = None  # the engine measured (meta.json); picks its kernel tables


def load_run(folder: Path) -> VllmRun:
    """Parse meta.json, requests.jsonl and validation/summary.txt of one run folder."""
    meta = json.loads((folder / "vllm" / "meta.json").read_text())
    rows = []
    for line_no, line in enumerate((folder / "vllm" / "requests.jsonl").read_text()
                                   .splitlines(), 1):
        try:
            r = json.loads(line)
            rows.append((float(r["arrival_time"]), int(r["input_toks"]), int(r["output_toks"])))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{folder}/vllm/requests.jsonl line {line_no}: {exc}") from None
    start = min(a for a, _, _ in rows)
    vllm, peer = {}, {}
    for line in (folder / "validation" / "summary.txt").read_text().splitlines():
        for label, key in METRICS.items():
            if line.startswith(label + " "):
                parts = line[len(label):].split()
                vllm[key], peer[key] = float(parts[0]), float(parts[1])
    if len(vllm) != len(METRICS):
        raise ValueError(f"{folder}/validation/summary.txt: expected rows {list(METRICS)}")
    gpu, model = LSS_GPUS[folder.parts[-2]], LSS_MODELS[folder.parts[-1]]
    return VllmRun(f"{folder.parts[-2]}/{folder.parts[-1]}", gpu, model, meta["engine_kwargs"],
                   meta.get("kv_cache", {}).get("num_gpu_blocks"),
                   tuple(sorted((a - start, p, o) for a, p, o in rows)), vllm, peer,
                   meta.get("vllm_version"))


def load_runs(root: Path = RUNS_DIR) -> list[VllmRun]:
    return [load_run(folder) for folder in sorted(root.glob("*/*")) if folder.is_dir()]


def run_deployment(run: VllmRun, gpu_file: Path | None = None,
                   cost: str = DEFAULT_COST) -> Deployment:
    """The run's deployment as servelab resolves vLLM's arguments: the model's shipped config,
    the GPU file (`gpu_file` in place of the shipped one), vLLM's KV pool rule (the pool vLLM
    reported, where meta.json has it), priced by `cost` (measured kernels at the run's own
    vLLM version)."""
    kw = run.engine_kwargs
    return build_deployment(DeploymentOptions(
        model=kw["model"], hardware=str(gpu_file or run.gpu), dtype=kw["dtype"],
        tensor_parallel=kw["tensor_parallel_size"], data_parallel=kw.get("data_parallel_size", 1),
        expert_parallel=bool(kw.get("enable_expert_parallel")), num_blocks=run.num_gpu_blocks,
        cost=cost, vllm_version=run.vllm_version if cost in ("auto", "kernels") else None))


def replay(run: VllmRun, gpu_file: Path | None = None, cost: str = DEFAULT_COST) -> dict:
    """Simulate `run` with its engine arguments; the summary dict of the whole run."""
    return replay_on(run, run_deployment(run, gpu_file, cost))


def replay_on(run: VllmRun, deployment: Deployment) -> dict:
    """Simulate `run` on `deployment` (run_deployment's); the summary dict of the run."""
    kw = run.engine_kwargs
    model, dp = deployment.cost_model, deployment.parallel.data_parallel
    if not isinstance(model, GpuCostModel):
        raise ValueError(f"{run.name}: expected the fitted GPU model, got {type(model).__name__}")
    config = SchedulerConfig(policy="chunked", num_blocks=deployment.kv_pool.num_blocks,
                             block_size=deployment.kv_pool.block_size,
                             max_num_seqs=kw["max_num_seqs"],
                             token_budget=kw["max_num_batched_tokens"],
                             max_model_len=kw.get("max_model_len") or 40960,
                             enable_prefix_caching=True)
    requests = [Request(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(run.requests)]
    if dp == 1:
        return summarize(run_trace(requests, Engine(Scheduler(config), model)))
    engines = [Engine(Scheduler(config), model) for _ in range(dp)]
    if deployment.parallel.expert_parallel:  # ranks joined by their experts step together
        return summarize(run_lockstep(requests, engines, model))
    cluster = ClusterConfig(num_replicas=dp, router=RouterConfig("least-requests"))
    return summarize(run_cluster(requests, engines, cluster).run_result())
