"""Synthetic traces: Poisson or gamma (bursty) arrivals and length distributions.

All randomness comes from the `numpy.random.Generator` the caller passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from workloads.trace import Trace

MAX_LENGTH_TOKENS = 2**31 - 1  # heavy tails (Pareto) are capped here before the int cast


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


class LengthDist(Protocol):
    """A distribution of token counts."""

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """`count` int64 lengths, each >= 1."""
        ...


def _to_lengths(values: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(values), 1, MAX_LENGTH_TOKENS).astype(np.int64)


@dataclass(frozen=True)
class Fixed:
    """Every length is `tokens`."""

    tokens: int

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"fixed length must be >= 1, got {self.tokens}")

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(count, self.tokens, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Integers uniform on [low_tokens, high_tokens], both ends included."""

    low_tokens: int
    high_tokens: int

    def __post_init__(self) -> None:
        if not 1 <= self.low_tokens <= self.high_tokens:
            raise ValueError(f"need 1 <= low <= high, got {self.low_tokens}, {self.high_tokens}")

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.low_tokens, self.high_tokens, count, endpoint=True)


@dataclass(frozen=True)
class LogNormal:
    """exp(Normal(ln median, sigma^2)), rounded: the median is `median_tokens`."""

    median_tokens: float
    sigma: float

    def __post_init__(self) -> None:
        if not self.median_tokens >= 1 or not self.sigma >= 0:
            raise ValueError(
                f"need median >= 1, sigma >= 0, got {self.median_tokens}, {self.sigma}"
            )

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return _to_lengths(rng.lognormal(np.log(self.median_tokens), self.sigma, count))


@dataclass(frozen=True)
class Pareto:
    """Classic Pareto: P(X > x) = (min_tokens / x)^alpha for x >= min_tokens, rounded."""

    min_tokens: float
    alpha: float

    def __post_init__(self) -> None:
        if not self.min_tokens >= 1 or not self.alpha > 0:
            raise ValueError(f"need min >= 1, alpha > 0, got {self.min_tokens}, {self.alpha}")

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        # numpy's pareto is the Lomax (shifted) form: 1 + it is the classic one.
        return _to_lengths(self.min_tokens * (1.0 + rng.pareto(self.alpha, count)))


@dataclass(frozen=True, eq=False)
class Empirical:
    """Lengths resampled (with replacement) from one column of a real trace."""

    trace: Trace
    column: str  # "prompt_len" or "output_len"

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        values = self.trace.table[self.column].to_numpy()
        return values[rng.integers(0, len(values), count)]


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic trace: `num_requests` arrivals at `rate_per_s` with length distributions."""

    num_requests: int
    rate_per_s: float
    prompt: LengthDist
    output: LengthDist
    arrival: str = "poisson"  # "poisson" or "gamma"
    cv: float = 1.0  # gamma inter-arrival coefficient of variation; > 1 is bursty

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"n must be >= 1, got {self.num_requests}")
        if not self.rate_per_s > 0:
            raise ValueError(f"rate must be > 0, got {self.rate_per_s}")
        if self.arrival not in ("poisson", "gamma"):
            raise ValueError(f"arrival must be poisson or gamma, got {self.arrival!r}")
        if not self.cv > 0:
            raise ValueError(f"cv must be > 0, got {self.cv}")


def generate_trace(spec: SyntheticSpec, rng: np.random.Generator, name: str = "synthetic") -> Trace:
    """Draw a trace: arrivals first, then prompt and output lengths, all from `rng`."""
    count = spec.num_requests
    if spec.arrival == "gamma":
        arrival_s = gamma_arrivals_s(count, spec.rate_per_s, spec.cv, rng)
    else:
        arrival_s = poisson_arrivals_s(count, spec.rate_per_s, rng)
    prompt, output = spec.prompt, spec.output
    if (
        isinstance(prompt, Empirical)
        and isinstance(output, Empirical)
        and (prompt.trace is output.trace)
    ):
        # Same source for both: resample whole rows so prompt/output correlation is kept.
        rows = rng.integers(0, len(prompt.trace), count)
        prompt_len = prompt.trace.table[prompt.column].to_numpy()[rows]
        output_len = output.trace.table[output.column].to_numpy()[rows]
    else:
        prompt_len = prompt.sample(count, rng)
        output_len = output.sample(count, rng)
    return Trace.from_arrays(name, arrival_s, prompt_len, output_len)
