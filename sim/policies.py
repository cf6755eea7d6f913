"""The batching policies by `--policy` name: a new policy is a class and a line here."""

from __future__ import annotations

from sim.batching import BatchingPolicy, ChunkedBatching, ContinuousBatching, RecomputeBatching
from sim.static_padding import StaticBatching

BATCHING: dict[str, type[BatchingPolicy]] = {
    "static": StaticBatching,
    "continuous": ContinuousBatching,
    "recompute": RecomputeBatching,
    "chunked": ChunkedBatching,
}
