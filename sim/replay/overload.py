"""Whether a run kept up with its arrivals, and if not, what held it back.

Read from the run's step table (sim.replay.metrics.step_table) and request table
(request_table), both of one engine:
  - queue growth: the slope of the waiting-queue length over the second half of the arrival
    window (requests/s; a drain after the last arrival is no part of it);
  - falling behind: the queue grows faster than GROWTH_SHARE of the offered rate;
  - binding resource: over the steps that left requests waiting, the limit each step hit
    (KV blocks nearly full or a preemption, the token budget filled, max_num_seqs rows);
    a step that hit none was bound by compute (requests arrived while it ran);
  - sustainable rate: completed requests per busy second (the steps' summed durations), at
    the batch sizes this run reached: a light run's is a lower bound.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

GROWTH_SHARE = 0.05  # queue growth above this share of the offered rate: falling behind
KV_FULL = 0.95  # blocks used over the pool at which a waiting request counts as KV-bound
BUDGET_FULL = 0.9  # tokens computed over the budget at which a step counts as budget-bound
RESOURCES = ("KV blocks", "token budget", "sequences", "compute")
_DONE = ("length", "stop")


@dataclass(frozen=True)
class EngineLimits:
    """The limits of the engine a run's steps were taken on."""

    num_blocks: int
    token_budget: int
    max_num_seqs: int


@dataclass(frozen=True)
class Overload:
    """A run's overload verdict (see the module docstring for each field's rule)."""

    state: str  # "stable" or "falling behind"
    queue_growth_rps: float  # waiting requests gained per second, second half of arrivals
    offered_rps: float  # requests over the arrival window
    binding: str  # one of RESOURCES, or "none" when no step left a request waiting
    binding_share: float  # of the steps that left requests waiting, those it bound
    waited_share: float  # of all steps, those that left requests waiting
    sustainable_rps: float | None  # completed requests per busy second (None: no busy time)

    def to_dict(self) -> dict:
        return asdict(self)


def overload_verdict(steps: pd.DataFrame, requests: pd.DataFrame,
                     limits: EngineLimits) -> Overload:
    """The verdict of one engine's run."""
    arrivals = requests["arrival_s"].to_numpy(dtype=float)
    span_s = float(arrivals.max() - arrivals.min()) if arrivals.size else 0.0
    offered = len(arrivals) / span_s if span_s > 0 else float("inf")
    growth = queue_growth_rps(steps, float(arrivals.min()) if arrivals.size else 0.0, span_s)
    binding, share = binding_resource(steps, limits)
    busy_s = float(steps["duration_s"].sum()) if len(steps) else 0.0
    completed = int(requests["finish_reason"].isin(_DONE).sum())
    falling = growth > GROWTH_SHARE * offered if np.isfinite(offered) else growth > 0
    waited = float((steps["num_waiting"] > 0).mean()) if len(steps) else 0.0
    return Overload("falling behind" if falling else "stable", growth, offered, binding, share,
                    waited, completed / busy_s if busy_s > 0 else None)


def queue_growth_rps(steps: pd.DataFrame, first_arrival_s: float, span_s: float) -> float:
    """Least-squares slope of the waiting queue against time over the arrival window's second
    half, each step weighted by its duration (0 with fewer than two steps there)."""
    start = steps["start_s"].to_numpy(dtype=float)
    window = (start >= first_arrival_s + span_s / 2) & (start <= first_arrival_s + span_s)
    if span_s <= 0:  # every request at once: the whole run is the window
        window = np.ones(len(start), dtype=bool)
    t = start[window]
    if t.size < 2 or np.ptp(t) == 0:
        return 0.0
    waiting = steps["num_waiting"].to_numpy(dtype=float)[window]
    weight = np.sqrt(np.maximum(steps["duration_s"].to_numpy(dtype=float)[window], 1e-12))
    slope, _ = np.polyfit(t - t.mean(), waiting, 1, w=weight)
    return float(slope)


def binding_resource(steps: pd.DataFrame, limits: EngineLimits) -> tuple[str, float]:
    """The limit hit most often by the steps that left requests waiting, and its share."""
    waited = steps[steps["num_waiting"] > 0]
    if waited.empty:
        return "none", 0.0
    kv = ((waited["kv_blocks_used"] >= KV_FULL * limits.num_blocks)
          | (waited["num_preempted"] > 0)).to_numpy()
    budget = (waited["num_tokens"] >= BUDGET_FULL * limits.token_budget).to_numpy()
    seqs = (waited["batch_size"] >= limits.max_num_seqs).to_numpy()  # (running after the
    # step misses the rows that finished in it)
    compute = ~(kv | budget | seqs)
    counts = [int(hit.sum()) for hit in (kv, budget, seqs, compute)]
    best = int(np.argmax(counts))  # ties go to the first: a hard limit before compute
    return RESOURCES[best], counts[best] / len(waited)
