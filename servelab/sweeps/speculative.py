"""Speculative decoding against load: each policy at each rate simulated with and without
speculation, and the rate where speculation stops paying (its mean TPOT no longer below
plain decoding's).

Speculation spends spare compute in decode steps; as load rises the batch grows, steps turn
compute-bound, and verifying k proposals per row costs more than the tokens they save.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from sim.cluster.config import ClusterConfig
from sim.engine.core import Backend
from sim.engine.scheduler_config import SchedulerConfig
from sim.policy_runs import simulate_policy
from sim.replay.metrics import Slo
from workloads.trace import Trace
from workloads.transforms import scale_qps

# Rate multipliers a crossover sweep runs by default: from light load to past saturation of
# the default deployment on the bundled conversation trace.
DEFAULT_SPECULATIVE_QPS_SCALES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


@dataclass(frozen=True)
class SpeculativeSweep:
    """What every run shares: the trace at scale 1, the cost model, each policy's scheduler
    config (speculation on), and how requests arrive."""

    trace: Trace
    backend: Backend
    configs: dict[str, SchedulerConfig]
    slo: Slo | None = None
    cluster: ClusterConfig | None = None
    users: int | None = None  # closed loop by this many users (None: the trace's arrivals)
    open_loop: bool = False


@dataclass(frozen=True)
class SpeculativePoint:
    """One policy at one rate, with speculation or without."""

    policy: str
    qps_scale: float
    speculative: bool


def speculative_points(policies: Sequence[str], qps_scales: Sequence[float]
                       ) -> list[SpeculativePoint]:
    """Every policy x rate, with and without speculation, slowest (lowest rate) first."""
    points = [SpeculativePoint(p, float(s), spec) for s in sorted(qps_scales)
              for p in policies for spec in (False, True)]
    return points


def run_speculative_point(sweep: SpeculativeSweep, point: SpeculativePoint) -> dict:
    """Simulate one point as `compare` runs a policy; its row: the point, the request rate
    and the run's summary (a runner's task: servelab.sweeps.runners)."""
    config = sweep.configs[point.policy]
    if not point.speculative:
        config = replace(config, speculative=None)
    trace = sweep.trace if point.qps_scale == 1 else scale_qps(sweep.trace, point.qps_scale)
    outcome = simulate_policy(trace, config, sweep.backend, sweep.slo, False, False,
                              sweep.cluster, sweep.users, sweep.open_loop)
    rate = len(trace) / trace.span_s if trace.span_s > 0 else float("inf")
    return {"policy": point.policy, "qps_scale": point.qps_scale,
            "speculative": point.speculative, "rate_rps": rate, **outcome.summary}


def paired_rows(rows: Sequence[dict]) -> list[dict]:
    """One row per policy and rate: plain and speculative mean TPOT and output throughput,
    and the speedups (TPOT plain / speculative, throughput speculative / plain; > 1 pays)."""
    by_key = {(r["policy"], r["qps_scale"], r["speculative"]): r for r in rows}
    paired = []
    for (policy, scale, spec), plain in by_key.items():
        if spec:
            continue
        fast = by_key[(policy, scale, True)]
        tpot, plain_tpot = fast.get("mean_tpot_ms"), plain.get("mean_tpot_ms")
        thr, plain_thr = fast.get("output_throughput"), plain.get("output_throughput")
        paired.append({
            "policy": policy, "qps_scale": scale, "rate_rps": plain["rate_rps"],
            "plain_mean_tpot_ms": plain_tpot, "spec_mean_tpot_ms": tpot,
            "tpot_speedup": plain_tpot / tpot if tpot and plain_tpot else None,
            "plain_output_throughput": plain_thr, "spec_output_throughput": thr,
            "throughput_speedup": thr / plain_thr if thr and plain_thr else None,
        })
    return sorted(paired, key=lambda r: (r["policy"], r["qps_scale"]))


def crossover(paired: Sequence[dict]) -> dict:
    """Where one policy's speculation stops paying, from its paired rows (any order).

    `state`: "crossover" (it pays, then at a higher rate it does not: `rate_rps` and
    `qps_scale` interpolated where the TPOT speedup crosses 1, `bracket_rps` the two rates
    around it), "pays throughout" (no crossover in range) or "never pays" (slower already at
    the lowest rate)."""
    rows = sorted((r for r in paired if r["tpot_speedup"] is not None),
                  key=lambda r: r["qps_scale"])
    record = {"state": "pays throughout", "rate_rps": None, "qps_scale": None,
              "bracket_rps": None,
              "range_rps": [rows[0]["rate_rps"], rows[-1]["rate_rps"]] if rows else None}
    if not rows:
        record["state"] = "no runs"
        return record
    if rows[0]["tpot_speedup"] <= 1:
        record["state"] = "never pays"
        return record
    for before, after in zip(rows, rows[1:], strict=False):
        if after["tpot_speedup"] > 1:
            continue
        share = (before["tpot_speedup"] - 1) / (before["tpot_speedup"] - after["tpot_speedup"])
        record.update(
            state="crossover",
            rate_rps=before["rate_rps"] + share * (after["rate_rps"] - before["rate_rps"]),
            qps_scale=before["qps_scale"] + share * (after["qps_scale"] - before["qps_scale"]),
            bracket_rps=[before["rate_rps"], after["rate_rps"]])
        break
    return record


def describe_crossover(policy: str, record: dict) -> str:
    """One line: where it stops paying, or that it does not in the range run."""
    state = record["state"]
    if state == "no runs":
        return f"{policy}: no rate with a mean TPOT to compare"
    low, high = record["range_rps"]
    if state == "crossover":
        before, after = record["bracket_rps"]
        return (f"{policy}: speculation stops paying at ~{record['rate_rps']:.2f} req/s "
                f"(x{record['qps_scale']:.3g}; faster at {before:.2f} req/s, slower at "
                f"{after:.2f})")
    if state == "never pays":
        return (f"{policy}: no crossover in {low:.2f}-{high:.2f} req/s: speculation is "
                "slower already at the lowest rate")
    return (f"{policy}: no crossover in {low:.2f}-{high:.2f} req/s: speculation pays at "
            "every rate run")
