"""Replay AIConfigurator's measured H100 vLLM runs (sim.measured.silicon_rows)
through the simulator: each row's closed loop on its engine, priced by whatever cost model
the deployment builds by default; mean TTFT and TPOT against the measured, and the error
statistics per model, TP and precision.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from sim.cluster.closed_loop import ClosedLoop, run_closed_cluster, run_closed_trace
from sim.cluster.dp_lockstep import run_lockstep
from sim.cluster.router import RouterConfig
from sim.cluster.run import ClusterConfig
from sim.cost.engine_overhead import load_engine
from sim.cost.gpu_cost import GpuCostModel
from sim.deployment import Deployment, DeploymentOptions, build_deployment
from sim.engine.core import FinishReason, Request
from sim.engine.scheduler import Scheduler, SchedulerConfig
from sim.engine.step import Engine
from sim.measured.silicon_rows import (
    HARDWARE,
    MEASURED_ROUNDS,
    MODELS_DIR,
    ReplayPlan,
    RowRefused,
    SiliconRow,
    load_rows,
    replay_plan,
)
from sim.pricing import DEFAULT_COST
from sim.replay.metrics import request_table
from sim.specs.model_config import (
    UnsupportedModelError,
    load_config,
    resolve_model,
    shipped_configs,
    spec_from_config,
)
from workloads.sessions import chains_of


@dataclass(frozen=True)
class RowResult:
    """A row and a prediction of its means (servelab's, or a peer's); None where refused."""

    row: SiliconRow
    ttft_ms: float | None
    tpot_ms: float | None
    refused: str = ""  # why there is no prediction

    @property
    def simulated(self) -> bool:
        return self.ttft_ms is not None and self.tpot_ms is not None

    @property
    def ttft_error(self) -> float:
        """Signed relative error of the predicted mean TTFT."""
        return (self.ttft_ms - self.row.ttft_ms) / self.row.ttft_ms

    @property
    def tpot_error(self) -> float:
        """Signed relative error of the predicted mean TPOT."""
        return (self.tpot_ms - self.row.tpot_ms) / self.row.tpot_ms


def row_model(row: SiliconRow) -> str:
    """What --model names for the row: a shipped Hugging Face id, else the row's config kept
    with the data; RowRefused when servelab has none or cannot price it."""
    if row.model.lower() in shipped_configs():
        return row.model
    path = MODELS_DIR / (row.model.replace("/", "--") + ".json")
    if not path.is_file():
        raise RowRefused(f"{row.model}: no model config")
    try:
        spec_from_config(load_config(path), row.model)
    except UnsupportedModelError as error:  # names the field it cannot price
        raise RowRefused(str(error)) from None
    return str(path)


def _checkpoint_precision(row: SiliconRow, model: str) -> SiliconRow:
    """The row as vLLM ran it: an fp4 row of a checkpoint whose experts are MXFP4 (gpt-oss,
    labelled nvfp4 by the source) serves the checkpoint as it is, with no --quantization:
    its experts MXFP4 weight-only on H100, the rest 16-bit. Any other row unchanged."""
    if row.precision != "fp4":
        return row
    spec = resolve_model(model)
    if spec.expert_quantization != "mxfp4" or spec.quantization:
        return row  # replay_plan names the precision it does not price
    return replace(row, precision="")


def row_plan(row: SiliconRow, rounds: int = MEASURED_ROUNDS) -> tuple[str, ReplayPlan]:
    """The model (row_model) and the engine and load (replay_plan) the row ran, its
    checkpoint's own precision applied; RowRefused for what servelab does not simulate."""
    model = row_model(row)  # the model's reason first: it outlasts a precision's
    return model, replay_plan(_checkpoint_precision(row, model), rounds)


def row_deployment(model: str, plan: ReplayPlan, hardware: str = HARDWARE,
                   cost: str = DEFAULT_COST, vllm_version: str | None = None) -> Deployment:
    """The deployment of `model` (row_model) as the row's vLLM engine flags resolve, priced
    by `cost` (a --cost value; `hardware`: a GPU preset or file), its host scheduling as
    `vllm_version` (the row's) schedules by default."""
    try:
        deployment = build_deployment(DeploymentOptions(
            model=model, hardware=hardware, tensor_parallel=plan.tensor_parallel,
            data_parallel=plan.data_parallel, expert_parallel=plan.expert_parallel,
            max_num_batched_tokens=plan.max_num_batched_tokens,
            max_num_seqs=plan.max_num_seqs, quantization=plan.quantization,
            kv_cache_dtype=plan.kv_cache_dtype, cost=cost))
    except ValueError as error:  # UnsupportedModelError included
        raise RowRefused(str(error)) from None
    if vllm_version and isinstance(deployment.cost_model, GpuCostModel):
        deployment.cost_model.use_engine(load_engine("vllm", vllm_version=vllm_version))
    return deployment


def scheduler_config(plan: ReplayPlan, deployment: Deployment) -> SchedulerConfig:
    """vLLM V1's scheduler for the row: chunked prefill from one token budget, prefix
    caching on, the generator's limits, the deployment's KV pool."""
    return SchedulerConfig(policy="chunked", num_blocks=deployment.kv_pool.num_blocks,
                           block_size=deployment.kv_pool.block_size,
                           max_num_seqs=plan.max_num_seqs,
                           token_budget=plan.max_num_batched_tokens,
                           max_model_len=plan.max_model_len, enable_prefix_caching=True)


def run_closed_loop(plan: ReplayPlan, deployment: Deployment,
                    first_send_s: Sequence[float] = ()) -> list[Request]:
    """The row's measured requests closed-loop through its engines: all users start at once
    (as aiperf starts them; `first_send_s`, one time per user, for another start), each
    sends its next request as its last answer ends; the requests, in the order sent.

    aiperf waits for every warm-up answer before its profiling phase starts, and a
    simulated engine has nothing to warm (no compilation, no allocation, and the random
    prompts share no prefix), so the warm-up leaves it as it found it: it is not replayed."""
    n = plan.measured_requests
    requests = [Request(f"r{i}", 0.0, plan.prompt_len, plan.output_len) for i in range(n)]
    # One lone chain per request, taken in row order: request i is the i-th one sent.
    loop = ClosedLoop(requests, chains_of([None] * n, [0] * n, [0.0] * n), [0.0] * n,
                      plan.users, first_send_s)
    config, backend = scheduler_config(plan, deployment), deployment.cost_model
    dp = plan.data_parallel
    if dp == 1:
        run_closed_trace(requests, Engine(Scheduler(config), backend), loop)
    elif plan.expert_parallel:  # vLLM's DP ranks with EP step together
        if not isinstance(backend, GpuCostModel):
            raise RowRefused(f"data parallel {dp} with expert parallel: the lockstep replay "
                             f"needs the GPU cost model, not {type(backend).__name__}")
        engines = [Engine(Scheduler(config), backend) for _ in range(dp)]
        run_lockstep(requests, engines, backend, loop)
    else:
        engines = [Engine(Scheduler(config), backend) for _ in range(dp)]
        cluster = ClusterConfig(num_replicas=dp, router=RouterConfig("least-requests"))
        run_closed_cluster(requests, engines, cluster, loop)
    return requests


def measured_means(requests: Sequence[Request]) -> tuple[float, float]:
    """Mean TTFT and TPOT (ms) of the requests, as aiperf's profiling phase reports them;
    RowRefused if any did not complete."""
    undone = [r for r in requests if r.finish_reason is not FinishReason.LENGTH]
    if undone:
        first = undone[0]
        why = first.finish_reason.value if first.finish_reason else "unfinished"
        detail = f"{why} {first.finish_detail}".strip()
        raise RowRefused(f"{len(undone)} requests did not complete ({first.request_id}: "
                         f"{detail})")
    table = request_table(list(requests))
    return float(table["ttft_ms"].mean()), float(table["tpot_ms"].mean())


def simulate_row(row: SiliconRow, rounds: int = MEASURED_ROUNDS,
                 hardware: str = HARDWARE) -> RowResult:
    """The row replayed (`rounds` measured rounds of its users) on `hardware` (an H100
    preset or file), or refused with the reason."""
    try:
        model, plan = row_plan(row, rounds)
        deployment = row_deployment(model, plan, hardware, vllm_version=row.engine_version)
        requests = run_closed_loop(plan, deployment)
        ttft_ms, tpot_ms = measured_means(requests)
    except RowRefused as refusal:
        return RowResult(row, None, None, str(refusal))
    return RowResult(row, ttft_ms, tpot_ms)


def simulate_rows(rows: Iterable[SiliconRow] | None = None, rounds: int = MEASURED_ROUNDS,
                  hardware: str = HARDWARE) -> list[RowResult]:
    """Every row (the shipped ones by default) replayed or refused."""
    rows = load_rows() if rows is None else rows
    return [simulate_row(row, rounds, hardware) for row in rows]


def result_record(result: RowResult) -> dict:
    """One row's measurement, prediction and error as JSON-ready data."""
    row, done = result.row, result.simulated
    return {"id": row.row_id, "model": row.model, "tp": row.tp,
            "precision": row.precision or "bf16", "isl": row.isl, "osl": row.osl,
            "users": row.batch_size * row.attention_dp, "measured_ttft_ms": row.ttft_ms,
            "measured_tpot_ms": row.tpot_ms, "ttft_ms": result.ttft_ms,
            "tpot_ms": result.tpot_ms, "ttft_error": result.ttft_error if done else None,
            "tpot_error": result.tpot_error if done else None, "refused": result.refused}


def error_stats(errors: Sequence[float]) -> dict[str, float | None]:
    """Signed median and p90 of |error| (None for no errors)."""
    if not errors:
        return {"median": None, "p90_abs": None}
    a = np.asarray(errors, dtype=float)
    return {"median": float(np.median(a)), "p90_abs": float(np.percentile(np.abs(a), 90))}


def group_key(row: SiliconRow) -> tuple[str, int, str]:
    """(model, TP, precision) a row is tabled under."""
    return row.model, row.tp, row.precision or "bf16"


def _group(name: str, tp: int | str, precision: str, results: list[RowResult]) -> dict:
    done = [r for r in results if r.simulated]
    ttft = error_stats([r.ttft_error for r in done])
    tpot = error_stats([r.tpot_error for r in done])
    return {"model": name, "tp": tp, "precision": precision, "rows": len(results),
            "simulated": len(done), "ttft_median": ttft["median"], "ttft_p90_abs": ttft["p90_abs"],
            "tpot_median": tpot["median"], "tpot_p90_abs": tpot["p90_abs"]}


def error_table(results: Sequence[RowResult]) -> list[dict]:
    """One line per (model, TP, precision), then an overall line (model "all")."""
    groups: dict[tuple[str, int, str], list[RowResult]] = {}
    for result in results:
        groups.setdefault(group_key(result.row), []).append(result)
    lines = [_group(*key, members) for key, members in sorted(groups.items())]
    return [*lines, _group("all", "-", "-", list(results))]


def refusals(results: Sequence[RowResult]) -> Counter:
    """How many rows each refusal reason turned away."""
    return Counter(r.refused for r in results if not r.simulated)


def _pct(value: float | None, signed: bool) -> str:
    if value is None:
        return "-"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def format_error_table(lines: Sequence[dict]) -> str:
    """The table as text: TTFT and TPOT signed median and p90 |error| per group."""
    out = [f"{'model':<26}{'TP':>3} {'precision':<10}{'rows':>5}{'sim':>5}"
           f"{'TTFT med':>10}{'TTFT p90|e|':>12}{'TPOT med':>10}{'TPOT p90|e|':>12}"]
    for g in lines:
        out.append(f"{g['model']:<26}{g['tp']!s:>3} {g['precision']:<10}{g['rows']:>5}"
                   f"{g['simulated']:>5}{_pct(g['ttft_median'], True):>10}"
                   f"{_pct(g['ttft_p90_abs'], False):>12}{_pct(g['tpot_median'], True):>10}"
                   f"{_pct(g['tpot_p90_abs'], False):>12}")
    return "\n".join(out)


def format_refusals(results: Sequence[RowResult]) -> str:
    """One line per refusal reason with its count."""
    return "\n".join(f"{count:>4} refused: {reason}"
                     for reason, count in refusals(results).most_common())
