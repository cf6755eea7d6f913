"""Arrival times: Poisson or gamma (bursty) processes, and load stages run back to back. All
randomness comes from the `numpy.random.Generator` the caller passes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STAGE_KINDS = ("rate", "concurrency")


@dataclass(frozen=True)
class Stage:
    """One load stage: `rate` requests/s for `duration_s`, or `concurrency` users that each
    send the next request when the previous one finished, `count` requests in all."""

    kind: str  # "rate" or "concurrency"
    value: float  # requests/s, or the number of users
    duration_s: float = 0.0  # rate stages only
    count: int = 0  # concurrency stages only: requests in the stage

    def __post_init__(self) -> None:
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"stage kind must be rate or concurrency, got {self.kind!r}")
        if not self.value > 0:
            raise ValueError(f"{self.kind}({self.value:g}, ...): must be > 0")
        if self.kind == "rate" and not self.duration_s > 0:
            raise ValueError(f"rate({self.value:g}, {self.duration_s:g}): duration must be > 0")
        if self.kind == "concurrency" and (self.count < 1 or self.value != int(self.value)):
            raise ValueError(
                f"concurrency({self.value:g}, {self.count}): need whole users and count >= 1"
            )


def poisson_arrivals_s(count: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Poisson process (exponential gaps), the first at 0."""
    _check_arrivals(count, rate_per_s, 1.0)
    return _from_gaps(rng.exponential(1.0 / rate_per_s, count - 1))


def gamma_arrivals_s(
    count: int, rate_per_s: float, cv: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival times with gamma gaps of mean 1/rate and coefficient of variation `cv`."""
    _check_arrivals(count, rate_per_s, cv)
    shape = 1.0 / cv**2  # a gamma's CV is 1/sqrt(shape); shape 1 is exponential
    return _from_gaps(rng.gamma(shape, 1.0 / (rate_per_s * shape), count - 1))


def _check_arrivals(count: int, rate_per_s: float, cv: float) -> None:
    if count < 1 or not rate_per_s > 0 or not cv > 0:
        raise ValueError(f"need count >= 1, rate > 0, cv > 0; got {count}, {rate_per_s}, {cv}")


def _from_gaps(gaps_s: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(gaps_s)])




def stage_arrivals_s(
    stages: tuple[Stage, ...], arrival: str, cv: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival times of rate stages back to back, each drawn over its own duration."""
    times, start_s = [], 0.0
    for stage in stages:
        times.append(start_s + _arrivals_within(stage, arrival, cv, rng))
        start_s += stage.duration_s
    return np.concatenate(times)


def _arrivals_within(stage: Stage, arrival: str, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Arrivals in [0, duration): even gaps (rate x duration of them) or drawn gaps."""
    if arrival == "constant":
        return np.arange(int(round(stage.value * stage.duration_s))) / stage.value
    mean = stage.value * stage.duration_s
    count = max(16, int(mean + 10 * np.sqrt(mean) + 16))  # enough gaps to pass the end
    while True:
        if arrival == "gamma":
            drawn = gamma_arrivals_s(count, stage.value, cv, rng)
        else:
            drawn = poisson_arrivals_s(count, stage.value, rng)
        if drawn[-1] >= stage.duration_s:
            return drawn[drawn < stage.duration_s]
        count *= 2


def open_loop_arrivals_s(
    count: int, rate_per_s: float, arrival: str, cv: float, rng: np.random.Generator
) -> np.ndarray:
    """`count` arrivals at `rate_per_s`: even gaps, Poisson or gamma."""
    if arrival == "constant":
        return np.arange(count) / rate_per_s
    if arrival == "gamma":
        return gamma_arrivals_s(count, rate_per_s, cv, rng)
    return poisson_arrivals_s(count, rate_per_s, rng)
