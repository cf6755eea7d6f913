"""What one sitting of speculative_lab.py measured and simulated, per load level, and its
printed table: per method and level, the measured speedups (median, min-max over the pairs),
the simulated ones and their ratio, the mean TPOTs behind them, the steps' priced / measured
sum, and where speculation stops paying."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.speculation.report import speedups
from workloads import Trace

METHODS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
              "prompt_lookup_min": 2},
    "draft_model": {"method": "draft_model", "draft_num_layers": 1,
                    "num_speculative_tokens": 3},
}


@dataclass
class Level:
    """One load level's measured runs and simulation, per method."""

    qps_scale: float
    trace: Trace
    config: SchedulerConfig  # plain; each method's adds its speculative config
    plain: list[dict] = field(default_factory=list)  # measured summaries, one per pair
    # method -> measured speculative summaries (with counters), one per pair
    spec: dict[str, list[dict]] = field(default_factory=dict)
    simulated: dict[str, dict[str, float]] = field(default_factory=dict)  # method -> speedups
    # "plain" or method -> one more measured run's steps, priced sum / measured sum
    steps_priced: dict[str, float] = field(default_factory=dict)

    @property
    def request_rate(self) -> float:
        """Requests per second of the scaled trace."""
        return len(self.trace) / self.trace.span_s


def pair_speedups(level: Level, method: str, key: str) -> np.ndarray:
    """The measured speedup of each A/B pair."""
    return np.array([speedups(s, p)[key] for p, s in zip(level.plain, level.spec[method],
                                                          strict=True)])


def crossover(rates: list[float], speedup: list[float]) -> str:
    """Where the TPOT speedup falls below 1 (linear between the levels around it)."""
    if speedup[0] < 1:
        return f"below {rates[0]:.1f} req/s"
    for i in range(1, len(rates)):
        (r0, s0), (r1, s1) = (rates[i - 1], speedup[i - 1]), (rates[i], speedup[i])
        if s1 < 1 <= s0:
            return f"~{r0 + (r1 - r0) * (s0 - 1) / (s0 - s1):.1f} req/s"
    return f"none in {rates[0]:.1f}-{rates[-1]:.1f} req/s"


def report(levels: list[Level], method: str) -> None:
    """The method's table: measured median [min-max], simulated, simulated / measured; the
    mean TPOTs behind the speedups; where speculation stops paying."""
    print(f"\n{method} ({json.dumps(METHODS[method])})")
    print(f"{'qps x':>6} {'req/s':>7} {'batch':>5} {'acc/row':>7} | {'TPOT measured':>18} "
          f"{'sim':>5} {'sim/meas':>8} {'counters':>8} {'average':>7} | "
          f"{'tok/s measured':>21} {'sim':>6} "
          f"{'sim/meas':>8} | "
          f"{'mean TPOT ms plain, spec: measured':>34} {'sim':>11}")
    tpot_med, tpot_sim = [], []
    for level in levels:
        tpot = pair_speedups(level, method, "spec_tpot_speedup")
        thr = pair_speedups(level, method, "spec_throughput_speedup")
        sim = level.simulated[method]
        tpot_med.append(float(np.median(tpot)))
        tpot_sim.append(sim["spec_tpot_speedup"])
        plain_ms = np.median([p["mean_tpot_ms"] for p in level.plain])
        spec_ms = np.median([s["mean_tpot_ms"] for s in level.spec[method]])
        print(f"{level.qps_scale:>6g} {level.request_rate:>7.1f} "
              f"{np.median([p['mean_batch_size'] for p in level.plain]):>5.1f} "
              f"{level.spec[method][0]['spec_mean_accepted_length']:>7.2f} | "
              f"{_spread(tpot):>18} {sim['spec_tpot_speedup']:>5.2f} "
              f"{sim['spec_tpot_speedup'] / tpot_med[-1]:>8.2f} "
              f"{sim['counters_tpot_speedup']:>8.2f} "
              f"{sim['average_tpot_speedup']:>7.2f} | {_spread(thr, 3):>21} "
              f"{sim['spec_throughput_speedup']:>6.3f} "
              f"{sim['spec_throughput_speedup'] / np.median(thr):>8.3f} | "
              f"{plain_ms:>23.3f}, {spec_ms:.3f} {sim['plain_tpot_ms']:>5.3f}, "
              f"{sim['spec_tpot_ms']:.3f}")
    steps = ", ".join(f"x{level.qps_scale:g} {level.steps_priced['plain']:.2f} / "
                      f"{level.steps_priced[method]:.2f}" for level in levels)
    print(f"steps priced / measured, summed over one more run, plain / {method}: {steps}")
    rates = [level.request_rate for level in levels]
    print(f"stops paying (TPOT): measured {crossover(rates, tpot_med)}, simulated "
          f"{crossover(rates, tpot_sim)}")


def _spread(values: np.ndarray, digits: int = 2) -> str:
    return (f"{np.median(values):.{digits}f} [{values.min():.{digits}f}-"
            f"{values.max():.{digits}f}]")
