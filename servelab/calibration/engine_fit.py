"""Fit vLLM's own time (sim/cost/data/vllm_engine.json) with the measured-kernel model on
whole vLLM runs: AIConfigurator's H100 silicon rows (closed loops) and LLMServingSim's four
runs (open loops), then print both data sets before and after, for --cost gpu and kernels.

- request_s (front end per request): the L1 fit of relative TTFT error, the weighted median
  of (measured - predicted) TTFT with weights 1 / measured, clipped to its bounds;
- piecewise_layer_s (host per layer of a prefill or mixed step): a 1-D search over a grid in
  its bounds for the least mean |relative error| of TTFT and TPOT (each data set weighs
  half), request_s refitted at each point;
- step_s and per_row_s keep the published vLLM V1 figures (under async scheduling the GPU
  step hides them on these runs, so these data cannot set them).

    python -m servelab.calibration.engine_fit [--rounds N] [--no-write]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from servelab.calibration.engine_runs import Sample, samples
from servelab.reporting.engine_report import SILICON_ROUNDS, report
from sim.cost.engine_overhead import VLLM_PATH, EngineOverhead, load_vllm

PIECEWISE_GRID = 5  # points of the 1-D search, ends included


@dataclass(frozen=True)
class Fit:
    """The fitted terms and the objective they reached."""

    request_s: float
    piecewise_layer_s: float
    objective: float
    rows: int  # silicon rows priced


def bounds(term: str, data: dict | None = None) -> tuple[float, float]:
    """A term's physical bounds (seconds) as the JSON states them."""
    data = data if data is not None else json.loads(VLLM_PATH.read_text())
    lo, hi = data[term]["bounds"]
    return float(lo), float(hi)


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value minimising sum(w |v - x|) (the lower one where two tie)."""
    if not values:
        raise ValueError("weighted_median: no values")
    order = np.argsort(values)
    v, w = np.asarray(values, float)[order], np.asarray(weights, float)[order]
    cumulative = np.cumsum(w)
    return float(v[np.searchsorted(cumulative, cumulative[-1] / 2)])


def fit_request_s(done: Sequence[Sample], lo: float, hi: float,
                  request_s: float = 0.0) -> float:
    """The per-request time that minimises mean |relative TTFT error| of `done` (priced
    with `request_s` already in), within [lo, hi]."""
    residual = [s.measured_ttft_ms - (s.ttft_ms - request_s * 1e3) for s in done]
    best = weighted_median(residual, [1.0 / s.measured_ttft_ms for s in done]) / 1e3
    return min(max(best, lo), hi)


def objective(sets: Sequence[Sequence[Sample]]) -> float:
    """Mean over data sets of mean |relative error| of TTFT and TPOT."""
    return float(np.mean([np.mean([abs(s.ttft_error) + abs(s.tpot_error) for s in done]) / 2
                          for done in sets if done]))


def shift_ttft(done: Sequence[Sample], delta_s: float) -> list[Sample]:
    """The samples with each TTFT `delta_s` longer (request_s's exact effect on TTFT)."""
    return [replace(s, ttft_ms=s.ttft_ms + delta_s * 1e3) for s in done]


def fit(price: Callable[[EngineOverhead], list[list[Sample]]], base: EngineOverhead,
        request_bounds: tuple[float, float], piecewise_bounds: tuple[float, float],
        grid: int = PIECEWISE_GRID) -> Fit:
    """The 1-D search over piecewise_layer_s, request_s fitted in closed form at each point;
    `price` gives the samples of each data set for an engine."""
    best: Fit | None = None
    for piecewise in np.linspace(*piecewise_bounds, grid):
        engine = replace(base, piecewise_layer_s=float(piecewise), request_s=0.0)
        sets = price(engine)
        request_s = fit_request_s([s for done in sets for s in done], *request_bounds)
        score = objective([shift_ttft(done, request_s) for done in sets])
        if best is None or score < best.objective:
            best = Fit(request_s, float(piecewise), score, len(sets[0]))
    return best


def write_fit(result: Fit) -> None:
    """Rewrite the fitted terms (and their source) in the vLLM engine file."""
    data = json.loads(VLLM_PATH.read_text())
    source = (f"engine_fit: measured-kernel model on {result.rows} AIConfigurator H100 vLLM 0.12 "
              "runs and LLMServingSim's four vLLM 0.19 runs")
    data["request_s"].update(value=result.request_s, source=source)
    data["piecewise_layer_s"].update(value=result.piecewise_layer_s, source=source)
    data["source"] = f"step_s, per_row_s: published vLLM V1 figures; the rest: {source}"
    VLLM_PATH.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fit vLLM's own time on whole vLLM runs.")
    parser.add_argument("--rounds", type=int, default=SILICON_ROUNDS,
                        help="measured rounds per silicon row while fitting (report: all)")
    parser.add_argument("--no-write", action="store_true", help="fit and report only")
    args = parser.parse_args(argv)
    # Before: the published host terms alone, as vLLM was priced until this fit.
    before = replace(load_vllm(), request_s=0.0, piecewise_layer_s=0.0)
    result = fit(lambda engine: samples(engine, "kernels", args.rounds), before,
                 bounds("request_s"), bounds("piecewise_layer_s"))
    print(f"fitted: request_s {result.request_s * 1e3:.2f} ms, piecewise_layer_s "
          f"{result.piecewise_layer_s * 1e6:.1f} us (objective {result.objective:.4f})")
    after = replace(before, request_s=result.request_s,
                    piecewise_layer_s=result.piecewise_layer_s)
    if not args.no_write:
        write_fit(result)
    print(report(before, after))


if __name__ == "__main__":
    main()
