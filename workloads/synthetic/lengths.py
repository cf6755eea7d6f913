"""Distributions of token counts for synthetic prompts and outputs; each draws from the
`numpy.random.Generator` the caller passes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from workloads.trace import Trace

MAX_LENGTH_TOKENS = 2**31 - 1  # heavy tails (Pareto) are capped here before the int cast


class LengthDist(Protocol):
    """A distribution of token counts."""

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """`count` int64 lengths, each >= 1."""
        ...


def to_lengths(values: np.ndarray) -> np.ndarray:
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
        return to_lengths(rng.lognormal(np.log(self.median_tokens), self.sigma, count))


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
        return to_lengths(self.min_tokens * (1.0 + rng.pareto(self.alpha, count)))


@dataclass(frozen=True, eq=False)
class Empirical:
    """Lengths resampled (with replacement) from one column of a real trace."""

    trace: Trace
    column: str  # "prompt_len" or "output_len"

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        values = self.trace.table[self.column].to_numpy()
        return values[rng.integers(0, len(values), count)]
