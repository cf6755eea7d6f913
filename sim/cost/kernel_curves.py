"""Interpolation over measured kernel latencies: exact at measured points, log-log between.

A `Curve` is one kernel's latency against one size (GEMM rows, tokens, KV length, bytes):
straight lines between measured points in log(size)-log(latency), so exact at every point
and monotone between two; below the smallest measured size it holds the smallest latency
(a kernel never gets cheaper than its launch), above the largest it grows as size**power,
linearly in the work (power 1 for rows, tokens, KV tokens and bytes; 2 for a causal
prefill's sequence length, whose work grows with its square). `blend` combines curves with
log-space weights, which is how a shape between measured ones is priced.
`streamed_ms_per_token` reads a decode-attention grid's own memory rate off its largest
points, the floor under any kernel priced from a table timed with its data in cache.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np


class Curve:
    """Latency (ms) against one size, from measured (size, latency) points."""

    __slots__ = ("xs", "ys", "power", "_lx", "_ly", "_slope")

    def __init__(self, xs: Sequence[float], ys: Sequence[float], power: float = 1.0) -> None:
        pairs = sorted(zip(xs, ys, strict=True))
        if not pairs:
            raise ValueError("Curve: no measured points")
        if any(x <= 0 or not y > 0 for x, y in pairs):
            raise ValueError("Curve: sizes and latencies must be > 0")
        if any(a[0] == b[0] for a, b in zip(pairs, pairs[1:], strict=False)):
            raise ValueError("Curve: a size measured twice")
        self.xs = tuple(float(x) for x, _ in pairs)
        self.ys = tuple(float(y) for _, y in pairs)
        self.power = power
        self._lx = tuple(math.log(x) for x in self.xs)
        self._ly = tuple(math.log(y) for y in self.ys)
        # d log(latency) / d log(size) of each segment (one per pair of neighbours)
        self._slope = tuple((self._ly[i + 1] - self._ly[i]) / (self._lx[i + 1] - self._lx[i])
                            for i in range(len(self.xs) - 1))

    def __call__(self, x: float) -> float:
        """Latency at size x (ms)."""
        xs = self.xs
        if x <= xs[0]:
            return self.ys[0]
        if x >= xs[-1]:
            return self.ys[-1] * (x / xs[-1]) ** self.power
        i = bisect.bisect_right(xs, x) - 1
        if xs[i] == x:
            return self.ys[i]
        return math.exp(self._ly[i] + self._slope[i] * (math.log(x) - self._lx[i]))

    def many(self, x: np.ndarray) -> np.ndarray:
        """Latencies at an array of sizes (the same values as calling it on each)."""
        x = np.asarray(x, dtype=float)
        logs = np.log(np.maximum(x, self.xs[0]))
        out = np.exp(np.interp(logs, self._lx, self._ly))
        above = x > self.xs[-1]
        if above.any():
            out[above] = self.ys[-1] * (x[above] / self.xs[-1]) ** self.power
        return out


def blend(parts: Iterable[tuple[Curve, float]], scale: float = 1.0) -> Curve:
    """The curve exp(sum w log c(x)) x scale over the union of the parts' sizes: weights
    summing to 1 interpolate between measured shapes in log space, exactly (a sum of
    piecewise-linear functions is piecewise linear on the union of their knots)."""
    parts = [(c, w) for c, w in parts if w]
    if len(parts) == 1 and parts[0][1] == 1.0 and scale == 1.0:
        return parts[0][0]
    knots = sorted({x for c, _ in parts for x in c.xs})
    ys = [scale * math.exp(sum(w * math.log(c(x)) for c, w in parts)) for x in knots]
    powers = {c.power for c, _ in parts}
    return Curve(knots, ys, power=powers.pop() if len(powers) == 1 else max(powers))


def pointwise(curves: Sequence[Curve], combine: Callable[[Iterable[float]], float]) -> Curve:
    """The curve of `combine` (min, sum) of the curves' latencies at each size any measured."""
    if len(curves) == 1:
        return curves[0]
    knots = sorted({x for c in curves for x in c.xs})
    return Curve(knots, [combine(c(x) for c in curves) for x in knots])


def bracket(grid: Sequence[int], x: float) -> tuple[list[tuple[int, float]], float]:
    """Where x falls in a sorted measured grid: ([(point, log-weight)], scale). Inside the
    grid, the two points around x with weights by log distance (one point, weight 1, when
    x is measured); outside, the nearest end with scale x / end (work linear in x)."""
    if x <= grid[0]:
        return [(grid[0], 1.0)], x / grid[0]
    if x >= grid[-1]:
        return [(grid[-1], 1.0)], x / grid[-1]
    i = bisect.bisect_left(grid, x)
    if grid[i] == x:
        return [(grid[i], 1.0)], 1.0
    lo, hi = grid[i - 1], grid[i]
    w = math.log(x / lo) / math.log(hi / lo)
    return [(lo, 1.0 - w), (hi, w)], 1.0


class Grid:
    """Latency against two sizes (batch, then sequence or KV length): one Curve per
    measured batch; a batch between two is their log-space blend, one beyond the largest
    scales linearly in batch, one below the smallest holds the smallest."""

    __slots__ = ("batches", "rows", "_row_cache")

    def __init__(self, rows: dict[int, Curve]) -> None:
        if not rows:
            raise ValueError("Grid: no measured rows")
        self.batches = tuple(sorted(rows))
        self.rows = rows
        self._row_cache: dict[int, Curve] = {}

    def row(self, batch: int) -> Curve:
        """The curve over the second size at `batch` (cached: a replay asks for few)."""
        curve = self._row_cache.get(batch)
        if curve is None:
            points, scale = bracket(self.batches, batch)
            if batch < self.batches[0]:
                scale = 1.0  # below the smallest batch: hold it (a launch-bound kernel)
            curve = blend(((self.rows[b], w) for b, w in points), scale)
            self._row_cache[batch] = curve
        return curve

    def __call__(self, batch: int, x: float) -> float:
        return self.row(batch)(x)


def graph_replayed_block(block: Curve, tensor: Curve) -> Curve:
    """Block-scaled fp8 GEMM times as a step inside a CUDA graph pays them. Upstream times
    that one GEMM table eagerly (every other table inside a CUDA graph), so its few-row
    times are the host's launches (a flat ~60-90 us on the H100, 7-9x the per-tensor fp8
    GEMM of the same bytes). A graph replays only the GPU's time: the per-tensor fp8 curve
    (same weight bytes, same tensor-core rate) scaled by the two tables' ratio at the
    largest row count both measured, where the GEMM is compute-bound and launches vanish;
    never above the eager time measured."""
    top = min(block.xs[-1], tensor.xs[-1])
    ratio = block(top) / tensor(top)
    knots = sorted({*block.xs, *tensor.xs})
    return Curve(knots, [min(block(m), ratio * tensor(m)) for m in knots], power=block.power)


# Decode attention reading at least this much KV (bytes) streams it from memory on every
# measured GPU: four times the largest L2 cache among them (RTX PRO 6000, 128 MB).
STREAMED_KV_BYTES = 512 * 2**20


def streamed_ms_per_token(grid: Grid, kv_bytes_per_token: float) -> float:
    """Milliseconds to read one token's KV of one layer from GPU memory, at the median rate
    of the decode attention `grid` (ms by rows, then KV length per row) over its points
    reading at least STREAMED_KV_BYTES; 0 (no floor) where no point reads that much."""
    rates = sorted(rows * length * kv_bytes_per_token / ms
                   for rows, curve in grid.rows.items()
                   for length, ms in zip(curve.xs, curve.ys, strict=True)
                   if rows * length * kv_bytes_per_token >= STREAMED_KV_BYTES)
    if not rates:
        return 0.0
    return kv_bytes_per_token / rates[len(rates) // 2]
