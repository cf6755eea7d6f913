"""Replay LLMServingSim's four real vLLM runs through servelab's simulator with the fitted
GPU cost model: same arrivals, lengths and engine arguments (meta.json), vLLM's KV pool."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from calibration.gpu_profiles import DATA_DIR, LSS_GPUS, LSS_MODELS
from sim.cluster import ClusterConfig, run_cluster
from sim.core import Request
from sim.dp_lockstep import run_lockstep
from sim.engine import Engine
from sim.gpu_cost import GpuCostModel, load_engine
from sim.gpu_shapes import known_gpu, known_shapes
from sim.metrics import summarize
from sim.router import RouterConfig
from sim.scheduler import Scheduler, SchedulerConfig
from sim.simulation import run_trace

RUNS_DIR = DATA_DIR / "llmservingsim" / "bench" / "examples"
# summary.txt row label -> servelab summary key.
METRICS = {"TTFT Mean": "mean_ttft_ms", "TTFT P99": "p99_ttft_ms", "TPOT Mean": "mean_tpot_ms",
           "TPOT P99": "p99_tpot_ms", "Latency Mean": "mean_e2el_ms",
           "Latency P99": "p99_e2el_ms"}
GiB = 2**30
# vLLM's memory besides weights and KV on one GPU (CUDA context, activation peak, graphs),
# for runs whose meta.json does not record the KV pool.
VLLM_RESERVE_BYTES = 3 * GiB


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
                   tuple(sorted((a - start, p, o) for a, p, o in rows)), vllm, peer)


def load_runs(root: Path = RUNS_DIR) -> list[VllmRun]:
    return [load_run(folder) for folder in sorted(root.glob("*/*")) if folder.is_dir()]


def vllm_blocks(run: VllmRun, memory_bytes: float, block_size: int = 16) -> int:
    """vLLM's KV pool per engine: 0.9 of each GPU less its weights and reserve."""
    if run.num_gpu_blocks is not None:
        return run.num_gpu_blocks
    s = known_shapes(run.model)
    kw = run.engine_kwargs
    tp, ep = kw["tensor_parallel_size"], kw["data_parallel_size"] if kw.get(
        "enable_expert_parallel") else 1
    h, kv = s.hidden_size, s.num_kv_heads * s.head_dim
    attn = s.num_heads * s.head_dim * h * 2 + 2 * h * kv
    mlp = (3 * s.num_experts * h * s.moe_intermediate_size // ep if s.is_moe
           else 3 * h * s.intermediate_size)
    weights = (s.num_layers * (attn + mlp) + 2 * s.vocab_size * h) * 2 / tp
    free = 0.9 * memory_bytes - weights - VLLM_RESERVE_BYTES
    per_block = s.num_layers * 2 * max(1, s.num_kv_heads // tp) * s.head_dim * 2 * block_size
    return int(free // per_block)


# Device memory of one GPU as the runs' meta.json report it (RTX 4090) or the datasheet.
GPU_MEMORY = {"rtx-4090": 25250627584, "rtx-pro-6000": 96 * GiB}


def replay(run: VllmRun, engine_name: str = "vllm") -> dict:
    """Simulate `run` with its engine arguments; the summary dict of the whole run."""
    kw = run.engine_kwargs
    tp, dp = kw["tensor_parallel_size"], kw.get("data_parallel_size", 1)
    ep = dp if kw.get("enable_expert_parallel") else 1
    model = GpuCostModel(known_shapes(run.model), known_gpu(run.gpu), load_engine(engine_name),
                         tensor_parallel=tp, expert_parallel=ep)
    config = SchedulerConfig(policy="chunked", num_blocks=vllm_blocks(run, GPU_MEMORY[run.gpu]),
                             block_size=16, max_num_seqs=kw["max_num_seqs"],
                             token_budget=kw["max_num_batched_tokens"],
                             max_model_len=kw.get("max_model_len") or 40960,
                             enable_prefix_caching=True)
    requests = [Request(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(run.requests)]
    if dp == 1:
        return summarize(run_trace(requests, Engine(Scheduler(config), model)))
    engines = [Engine(Scheduler(config), model) for _ in range(dp)]
    if ep > 1:  # ranks joined by their experts step together
        return summarize(run_lockstep(requests, engines, model))
    cluster = ClusterConfig(num_replicas=dp, router=RouterConfig("least-requests"))
    return summarize(run_cluster(requests, engines, cluster).run_result())
