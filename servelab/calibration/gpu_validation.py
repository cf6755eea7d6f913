"""Validate the fitted GPU cost model on data it was never fitted on.

1. Splitwise's Llama-2-70B steps (A100, H100; TP 2/4/8): signed median and p90 error per
   GPU, TP and phase, priced with Splitwise's eager engine overhead (set on BLOOM-176B).
2. LLMServingSim's four real vLLM 0.19 runs replayed: our error and LLMServingSim's own on
   mean/p99 TTFT, TPOT and E2E latency, side by side.

    python -m servelab.calibration.gpu_validation
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.calibration.gpu_replay import METRICS, load_runs, replay
from servelab.calibration.splitwise import splitwise_steps
from sim.cost.engine_overhead import load_engine
from sim.cost.gpu_cost import GpuCostModel
from sim.cost.gpu_shapes import known_gpu, known_shapes
from sim.pricing import DEFAULT_COST


@dataclass(frozen=True)
class StepError:
    gpu: str
    tp: int
    phase: str
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def splitwise_errors(model: str = "llama-2-70b") -> list[StepError]:
    """Every Splitwise step of `model`, predicted with Splitwise's engine overhead."""
    out = []
    for step in splitwise_steps(model=model):
        cost = GpuCostModel(known_shapes(model), known_gpu(step.gpu),
                            load_engine(f"splitwise-{step.gpu}"), tensor_parallel=step.tp)
        out.append(StepError(step.gpu, step.tp, step.phase, step.measured_s,
                             cost.predict(step.plan())))
    return out


def splitwise_table(errors: list[StepError]) -> list[dict]:
    """Per (GPU, TP, phase): steps, signed median, median |error|, p90 |error|."""
    cells: dict[tuple, list[float]] = defaultdict(list)
    for e in errors:
        cells[(e.gpu, e.tp, e.phase)].append(e.error)
    rows = []
    for (gpu, tp, phase), errs in sorted(cells.items()):
        a = np.array(errs)
        rows.append({"gpu": gpu, "tp": tp, "phase": phase, "steps": len(a),
                     "median_error": float(np.median(a)),
                     "median_abs_error": float(np.median(np.abs(a))),
                     "p90_abs_error": float(np.percentile(np.abs(a), 90))})
    return rows


def run_table(gpu_files: dict[str, Path] | None = None, cost: str = DEFAULT_COST) -> list[dict]:
    """Per run and metric: vLLM's value, ours, our error, LLMServingSim's error. `gpu_files`:
    GPU files by preset name, in place of the shipped ones (measured all-reduces, say); `cost`
    the --cost that prices the replays."""
    rows = []
    for run in load_runs():
        ours = replay(run, (gpu_files or {}).get(run.gpu), cost)
        for key in METRICS.values():
            measured = run.vllm[key]
            rows.append({"run": run.name, "metric": key, "vllm": measured, "ours": ours[key],
                         "our_error": (ours[key] - measured) / measured,
                         "peer_error": (run.peer[key] - measured) / measured})
    return rows


def format_splitwise(rows: list[dict]) -> str:
    lines = [f"{'GPU':<11}{'TP':>3} {'phase':<8}{'steps':>6}{'median':>9}{'|median|':>10}"
             f"{'p90 |err|':>11}"]
    for r in rows:
        lines.append(f"{r['gpu']:<11}{r['tp']:>3} {r['phase']:<8}{r['steps']:>6}"
                     f"{r['median_error']:>+9.1%}{r['median_abs_error']:>10.1%}"
                     f"{r['p90_abs_error']:>11.1%}")
    return "\n".join(lines)


def format_runs(rows: list[dict]) -> str:
    lines = [f"{'run':<40}{'metric':<14}{'vLLM':>10}{'ours':>10}{'ours err':>10}"
             f"{'LLMServingSim err':>19}"]
    for r in rows:
        lines.append(f"{r['run']:<40}{r['metric']:<14}{r['vllm']:>10.1f}{r['ours']:>10.1f}"
                     f"{r['our_error']:>+10.1%}{r['peer_error']:>+19.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The fitted GPU model against data never "
                                     "fitted on: Splitwise's steps and four real vLLM runs.")
    parser.add_argument("--cost", default=DEFAULT_COST, choices=("auto", "gpu", "kernels"),
                        help="what prices the vLLM runs' replays (kernels: the measured "
                             "tables at each run's vLLM version)")
    cost = parser.parse_args(argv).cost
    print("Splitwise Llama-2-70B steps (never fitted on), signed error of predicted step time")
    print(format_splitwise(splitwise_table(splitwise_errors())))
    print(f"\nLLMServingSim's real vLLM runs, replayed (never fitted on), --cost {cost}")
    print(format_runs(run_table(cost=cost)))


if __name__ == "__main__":
    main()
