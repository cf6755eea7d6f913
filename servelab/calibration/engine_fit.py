"""Fit vLLM's own time (sim/cost/data/vllm_engine.json) with the measured-kernel model on
whole vLLM runs: AIConfigurator's H100 silicon rows (closed loops) and LLMServingSim's four
runs (open loops), then print both data sets before and after, for --cost gpu and kernels.

1. piecewise_layer_s (host per layer of a prefill or mixed step): a 1-D search over a grid
   in its bounds for the least mean |relative error| of TTFT and TPOT (each data set weighs
   half); at each point
2. step_s and per_row_s (host per step, per sequence): bounded least squares of the mean
   TPOT each run misses with no host time, relative (weights 1 / measured), over the runs
   whose vLLM runs the host in series with the GPU (no async scheduling by default): there
   TPOT = GPU step + step_s + per_row_s x rows. Runs with async scheduling hide both, and
   so does a run whose GPU steps alone come out over twice its measured TPOT: its replay runs
   a batch the measured server did not (gpt-oss-120b's vLLM 0.11.2 rows at 512 users
   measured a batch of four's TPOT), and no host time explains it;
3. request_s (front end per request), priced with those: the L1 fit of relative TTFT
   error, the weighted median of (measured - predicted) TTFT, weights 1 / measured.
Every term is clipped to the bounds the JSON gives it.

    python -m servelab.calibration.engine_fit [--rounds N] [--no-write]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import lsq_linear

from servelab.calibration.engine_runs import Sample, samples
from servelab.reporting.engine_report import SILICON_ROUNDS, report
from sim.cost.engine_overhead import (
    VLLM_PATH,
    VLLM_TERMS,
    EngineOverhead,
    async_scheduling,
    load_vllm,
)

PIECEWISE_GRID = 5  # points of the 1-D search, ends included
# vLLM V1's host time as priced before this fit: 1-2 ms a step at small batches and about
# 10 us more per sequence (vLLM's CPU-overhead study, issue 6797).
PUBLISHED_STEP_S, PUBLISHED_PER_ROW_S = 1.5e-3, 10e-6
# A run whose replayed TPOT with no host time exceeds this multiple of its measured one ran
# another batch than its replay: it says nothing of the host.
UNMATCHED = 2.0


@dataclass(frozen=True)
class Fit:
    """The fitted terms, the objective they reached and the silicon rows priced."""

    step_s: float
    per_row_s: float
    piecewise_layer_s: float
    request_s: float
    objective: float
    rows: int

    def engine(self, base: EngineOverhead) -> EngineOverhead:
        """`base` with the fitted terms."""
        return replace(base, step_s=self.step_s, per_row_s=self.per_row_s,
                       piecewise_layer_s=self.piecewise_layer_s, request_s=self.request_s)


def all_bounds(path=VLLM_PATH) -> dict[str, tuple[float, float]]:
    """Each fitted term's physical bounds (seconds) as the JSON states them."""
    data = json.loads(path.read_text())
    return {term: (float(data[term]["bounds"][0]), float(data[term]["bounds"][1]))
            for term in VLLM_TERMS}


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


def fit_host(done: Sequence[Sample], step_bounds: tuple[float, float],
             row_bounds: tuple[float, float]) -> tuple[float, float] | None:
    """(step_s, per_row_s): bounded least squares of the relative TPOT that runs priced with
    no host time miss, over those whose vLLM does not schedule asynchronously and whose GPU
    steps alone are at most UNMATCHED x their measured TPOT; None when there are none (the
    data cannot see the host)."""
    serial = [s for s in done if not async_scheduling(s.version)
              and s.tpot_ms <= UNMATCHED * s.measured_tpot_ms]
    if not serial:
        return None
    weight = np.array([1.0 / s.measured_tpot_ms for s in serial])
    a = np.array([[1.0, s.rows] for s in serial]) * weight[:, None]
    b = np.array([(s.measured_tpot_ms - s.tpot_ms) / 1e3 for s in serial]) * weight
    lo, hi = zip(step_bounds, row_bounds, strict=True)
    step_s, per_row_s = lsq_linear(a, b, bounds=(lo, hi)).x
    return float(step_s), float(per_row_s)


def objective(sets: Sequence[Sequence[Sample]]) -> float:
    """Mean over data sets of mean |relative error| of TTFT and TPOT."""
    return float(np.mean([np.mean([abs(s.ttft_error) + abs(s.tpot_error) for s in done]) / 2
                          for done in sets if done]))


def shift_ttft(done: Sequence[Sample], delta_s: float) -> list[Sample]:
    """The samples with each TTFT `delta_s` longer (request_s's exact effect on TTFT)."""
    return [replace(s, ttft_ms=s.ttft_ms + delta_s * 1e3) for s in done]


def fit(price: Callable[[EngineOverhead], list[list[Sample]]], base: EngineOverhead,
        bounds: dict[str, tuple[float, float]], grid: int = PIECEWISE_GRID,
        progress: Callable[[Fit], None] | None = None) -> Fit:
    """Steps 1-3 of the module's method; `price` gives each data set's samples for an
    engine (its host overlapping the GPU as each run's vLLM version does); `progress` sees
    each grid point's fit."""
    bare = replace(base, step_s=0.0, per_row_s=0.0, piecewise_layer_s=0.0, request_s=0.0)
    best: Fit | None = None
    for piecewise in np.linspace(*bounds["piecewise_layer_s"], grid):
        engine = replace(bare, piecewise_layer_s=float(piecewise))
        host = fit_host(price(engine)[0], bounds["step_s"], bounds["per_row_s"])
        step_s, per_row_s = host if host is not None else (base.step_s, base.per_row_s)
        sets = price(replace(engine, step_s=step_s, per_row_s=per_row_s))
        request_s = fit_request_s([s for done in sets for s in done], *bounds["request_s"])
        point = Fit(step_s, per_row_s, float(piecewise), request_s,
                    objective([shift_ttft(done, request_s) for done in sets]), len(sets[0]))
        if progress is not None:
            progress(point)
        if best is None or point.objective < best.objective:
            best = point
    return best


def write_fit(result: Fit) -> None:
    """Rewrite the fitted terms (and their source) in the vLLM engine file."""
    data = json.loads(VLLM_PATH.read_text())
    source = (f"engine_fit: measured-kernel model on {result.rows} AIConfigurator H100 vLLM "
              "runs (the host step on those of vLLM before 0.14) and LLMServingSim's four "
              "vLLM 0.19 runs")
    for term in VLLM_TERMS:
        data[term].update(value=getattr(result, term), source=source)
    data["source"] = source
    VLLM_PATH.write_text(json.dumps(data, indent=1) + "\n")


def describe(result: Fit) -> str:
    """The fit's terms in ms and us, its objective and rows."""
    return (f"step_s {result.step_s * 1e3:.3f} ms, per_row_s {result.per_row_s * 1e6:.2f} us, "
            f"piecewise_layer_s {result.piecewise_layer_s * 1e6:.1f} us, request_s "
            f"{result.request_s * 1e3:.2f} ms (objective {result.objective:.4f}, "
            f"{result.rows} silicon rows)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fit vLLM's own time on whole vLLM runs.")
    parser.add_argument("--rounds", type=int, default=SILICON_ROUNDS,
                        help="measured rounds per silicon row (as measured: 20)")
    parser.add_argument("--no-write", action="store_true", help="fit and report only")
    args = parser.parse_args(argv)
    # Before: the published host step alone, overlapped at every version, as vLLM was
    # priced until this fit.
    published = replace(load_vllm(), step_s=PUBLISHED_STEP_S, per_row_s=PUBLISHED_PER_ROW_S,
                        piecewise_layer_s=0.0, request_s=0.0, overlapped=True)
    result = fit(lambda engine: samples(engine, "kernels", args.rounds), published,
                 all_bounds(), progress=lambda point: print("  tried", describe(point),
                                                            flush=True))
    print("fitted:", describe(result), flush=True)
    if not args.no_write:
        write_fit(result)
    print(report(published, result.engine(published)))


if __name__ == "__main__":
    main()
