"""Whole vLLM runs priced with a given vLLM engine's terms: AIConfigurator's H100 silicon rows
(sim.measured.silicon) and LLMServingSim's four runs (servelab.calibration.gpu_replay),
as mean TTFT and TPOT samples against the measured."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from servelab.calibration.gpu_replay import load_runs, replay_on, run_deployment
from sim.cost.engine_overhead import EngineOverhead, async_scheduling
from sim.cost.gpu_cost import GpuCostModel
from sim.deployment import Deployment
from sim.measured.silicon import (
    group_key,
    measured_means,
    row_deployment,
    row_plan,
    run_closed_loop,
)
from sim.measured.silicon_rows import RowRefused, load_rows


@dataclass(frozen=True)
class Sample:
    """One run's measured and predicted mean TTFT and TPOT (ms)."""

    name: str
    group: tuple  # (model, TP, precision) for silicon rows; (run,) for LLMServingSim's
    measured_ttft_ms: float
    measured_tpot_ms: float
    ttft_ms: float
    tpot_ms: float
    version: str | None = None  # the vLLM measured
    rows: float = 0.0  # sequences a decode step of one engine carries (its users)
    summary: dict = field(default_factory=dict, compare=False)  # the whole run's, if kept

    @property
    def ttft_error(self) -> float:
        return (self.ttft_ms - self.measured_ttft_ms) / self.measured_ttft_ms

    @property
    def tpot_error(self) -> float:
        return (self.tpot_ms - self.measured_tpot_ms) / self.measured_tpot_ms


def _priced(deployment: Deployment, engine: EngineOverhead, version: str | None,
            versioned: bool) -> Deployment:
    """The deployment with vLLM's terms replaced by `engine`'s; `versioned`: the host
    overlaps the GPU as the measured version schedules by default, else as `engine` says."""
    model = deployment.cost_model
    if not isinstance(model, GpuCostModel):
        raise RowRefused(f"priced by {type(model).__name__}, not a GPU cost model")
    overlapped = async_scheduling(version) if versioned else engine.overlapped
    model.use_engine(replace(engine, per_kernel_s=model.engine.per_kernel_s,
                             compute_scale=model.engine.compute_scale, overlapped=overlapped))
    return deployment


def silicon_samples(engine: EngineOverhead, cost: str, rounds: int,
                    versioned: bool = True) -> list[Sample]:
    """Every silicon row the simulator prices, replayed closed-loop for `rounds` rounds."""
    out = []
    for row in load_rows():
        version = row.engine_version or None
        try:
            model, plan = row_plan(row, rounds)  # as fidelity-gpu replays it
            deployment = _priced(row_deployment(model, plan, cost=cost), engine, version,
                                 versioned)
            ttft_ms, tpot_ms = measured_means(run_closed_loop(plan, deployment))
        except RowRefused:
            continue
        out.append(Sample(row.row_id, group_key(row), row.ttft_ms, row.tpot_ms, ttft_ms,
                          tpot_ms, version, plan.users / plan.data_parallel))
    return out


def run_samples(engine: EngineOverhead, cost: str, versioned: bool = True) -> list[Sample]:
    """LLMServingSim's four vLLM runs replayed open-loop (those `cost` prices: the RTX 4090
    has no kernel tables); each keeps its whole summary."""
    out = []
    for run in load_runs():
        try:
            deployment = run_deployment(run, None, cost)
        except ValueError:  # --cost kernels on a GPU without tables
            continue
        ours = replay_on(run, _priced(deployment, engine, run.vllm_version, versioned))
        out.append(Sample(run.name, (run.name,), run.vllm["mean_ttft_ms"],
                          run.vllm["mean_tpot_ms"], ours["mean_ttft_ms"], ours["mean_tpot_ms"],
                          run.vllm_version, ours.get("mean_batch_size", 0.0), ours))
    return out


def samples(engine: EngineOverhead, cost: str, rounds: int,
            versioned: bool = True) -> list[list[Sample]]:
    """[silicon rows, LLMServingSim's runs] priced by `cost` with `engine`'s terms."""
    return [silicon_samples(engine, cost, rounds, versioned),
            run_samples(engine, cost, versioned)]
