"""QPS sweeps and capacity search: the simulator over a grid of scheduler configurations.

A sweep point is one (policy, rate, KV pool, token budget, slot count) run of a trace; its
row is the run's summary. Points are independent, so a runner (sweeps.runners) may compute them
in any order on any worker: the simulation is deterministic and gives the same row anywhere.

Capacity follows Sarathi-Serve: the largest rate whose p99 TTFT and p99 time between tokens
(ITL) both meet their targets, found per configuration by bisection on the rate.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from sim.closed_loop import closed_loop
from sim.cluster import ClusterConfig
from sim.core import Backend, Request
from sim.metrics import Slo, summarize
from sim.policy_runs import run_deployment
from sim.scheduler import SchedulerConfig
from sim.verdict import SloWatch
from sim.workload import requests_from_trace
from workloads.trace import Trace
from workloads.transforms import scale_qps

# The rate multipliers a sweep runs by default: where the conv trace goes from light load to
# overload on the default deployment.
DEFAULT_QPS_SCALES = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0)


@dataclass(frozen=True)
class SweepPoint:
    """One configuration at one rate; None limits mean the deployment's default."""

    policy: str
    qps_scale: float
    num_blocks: int | None = None
    token_budget: int | None = None
    max_num_seqs: int = 256
    # Stop the run once it certainly misses this SLO (sim.verdict); None: run to the end.
    verdict: CapacitySlo | None = None

    @property
    def config_key(self) -> tuple:
        """Everything but the rate: the configuration a capacity search varies the rate of."""
        return (self.policy, self.num_blocks, self.token_budget, self.max_num_seqs)


@dataclass(frozen=True)
class SweepContext:
    """What every point of a sweep shares: the trace (at scale 1), the cost model, limits."""

    trace: Trace
    backend: Backend
    num_blocks: int  # default KV pool of the deployment
    block_size: int = 16
    max_model_len: int = 8192
    slo: Slo | None = None  # goodput SLOs, if any
    enable_prefix_caching: bool = True
    cluster: ClusterConfig | None = None  # replicas or a P/D split; None: one engine
    open_loop: bool = False  # sessions' turns at their written times, not closed-loop

    def config(self, point: SweepPoint) -> SchedulerConfig:
        return SchedulerConfig(
            policy=point.policy,
            num_blocks=point.num_blocks if point.num_blocks is not None else self.num_blocks,
            block_size=self.block_size,
            max_num_seqs=point.max_num_seqs,
            max_model_len=self.max_model_len,
            token_budget=point.token_budget,
            enable_prefix_caching=self.enable_prefix_caching,
        )


@dataclass(frozen=True)
class CapacitySlo:
    """Targets a rate must meet to count towards capacity (milliseconds, p99)."""

    ttft_p99_ms: float = 2000.0
    itl_p99_ms: float = 200.0

    def __post_init__(self) -> None:
        for key in ("ttft_p99_ms", "itl_p99_ms"):
            if not getattr(self, key) > 0:
                raise ValueError(f"capacity SLO {key} must be > 0, got {getattr(self, key)}")

    def met(self, row: dict) -> bool:
        """Whether a sweep row meets both targets with no request failed or left unfinished.

        Rejected requests (longer than the model or the pool allows) do not count against
        it: they are rejected at every rate, so they say nothing about load.
        """
        ttft, itl = row.get("p99_ttft_ms"), row.get("p99_itl_ms")
        return (row["failed"] == 0 and ttft is not None and itl is not None
                and ttft <= self.ttft_p99_ms and itl <= self.itl_p99_ms)


def grid(policies: Sequence[str], qps_scales: Sequence[float],
         num_blocks: Sequence[int | None] = (None,),
         token_budgets: Sequence[int | None] = (None,),
         max_num_seqs: Sequence[int] = (256,)) -> list[SweepPoint]:
    """Every combination, slowest first (low rates take the most steps).

    Token budgets vary `chunked` only: the other policies' budgets are not a knob (static
    prefills whole batches, continuous and recompute whole prompts).
    """
    if not policies or not qps_scales:
        raise ValueError("a sweep needs at least one policy and one rate")
    for scale in qps_scales:
        if not scale > 0:
            raise ValueError(f"qps scales must be > 0, got {scale}")
    points = []
    for policy, scale, blocks, seqs in itertools.product(policies, qps_scales, num_blocks,
                                                         max_num_seqs):
        budgets = token_budgets if policy == "chunked" else (None,)
        points += [SweepPoint(policy, float(scale), blocks, b, seqs) for b in budgets]
    return sorted(points, key=lambda p: p.qps_scale)


def run_point(context: SweepContext, point: SweepPoint) -> dict:
    """Simulate one point; its row: the point, the resolved limits, the rate, the summary
    (and `stopped_s` when the point carries a verdict SLO: when the run stopped, certain it
    fails, or None)."""
    config = context.config(point)  # invalid combinations fail here, naming the limit
    trace = scale_qps(context.trace, point.qps_scale) if point.qps_scale != 1 else context.trace
    requests = requests_from_trace(trace)
    loop = closed_loop(trace, requests, open_loop=context.open_loop)  # as simulate runs it
    result, _ = run_deployment(requests, config, context.backend, context.cluster,
                               verdict_watch(requests, point.verdict, config), loop)
    summary = summarize(result, context.slo)
    row = asdict(point)
    del row["verdict"]
    row.update(num_blocks=config.num_blocks, token_budget=config.budget,
               rate_rps=len(trace) / trace.span_s if trace.span_s > 0 else math.inf)
    if point.verdict is not None:
        row["stopped_s"] = result.stopped_s
    row.update(summary)
    return row


def verdict_watch(requests: list[Request], slo: CapacitySlo | None,
                  config: SchedulerConfig) -> SloWatch | None:
    """The step hook that stops a run once it certainly misses slo (None: no stop)."""
    if slo is None:
        return None
    return SloWatch(requests, slo.ttft_p99_ms, slo.itl_p99_ms, config.never_fits)


Runner = Callable[[Sequence[SweepPoint]], list[dict]]  # points -> rows, in order


@dataclass(frozen=True)
class Capacity:
    """A configuration's capacity: the largest rate found to meet the SLO."""

    point: SweepPoint  # the configuration, at the capacity rate (0 if none met)
    qps_scale: float
    rate_rps: float
    bounded: str  # "" when bracketed; "below-range" or "above-range" otherwise
    probes: list[dict]  # every row run while searching


def find_capacity(runner: Runner, configs: Sequence[SweepPoint], slo: CapacitySlo,
                  low: float, high: float, rel_tol: float = 0.05,
                  stop_early: bool = True,
                  known: Sequence[Sequence[dict]] | None = None) -> list[Capacity]:
    """Bisect (geometrically) each configuration's rate in [low, high] to within rel_tol;
    stop_early: each probe stops once it certainly misses the SLO (the same verdicts);
    known: rows each configuration already ran (a sweep's), reused for a probe at the
    same qps_scale instead of running it again (a run is deterministic).

    Each round runs one probe per unfinished configuration through `runner`, so a pool
    works on all configurations at once. Latency is assumed to grow with the rate, which
    holds for these schedulers except within noise of a knee.
    """
    if not 0 < low < high:
        raise ValueError(f"capacity search needs 0 < low < high, got {low}, {high}")
    if not rel_tol > 0:
        raise ValueError(f"rel_tol must be > 0, got {rel_tol}")
    verdict = slo if stop_early else None
    configs = [replace(c, verdict=verdict) for c in configs]
    by_scale = [{row["qps_scale"]: row for row in rows}
                for rows in (known if known is not None else [()] * len(configs))]
    if len(by_scale) != len(configs):
        raise ValueError(f"known has rows for {len(by_scale)} of {len(configs)} configurations")
    edges = iter(_probe(runner, [(i, replace(c, qps_scale=s)) for i, c in enumerate(configs)
                                 for s in (low, high)], by_scale))
    state = []
    for config in configs:
        lo_row, hi_row = next(edges), next(edges)
        search = {"config": config, "hi": high, "probes": [lo_row, hi_row], "bounded": ""}
        if slo.met(hi_row):
            search.update(lo=high, row=hi_row, bounded="above-range")
        elif slo.met(lo_row):
            search.update(lo=low, row=lo_row)
        else:
            search.update(lo=low, row=None, bounded="below-range")
        state.append(search)
    while True:
        open_ = [s for s in state if not s["bounded"] and s["hi"] / s["lo"] > 1 + rel_tol]
        if not open_:
            break
        mids = [math.sqrt(s["lo"] * s["hi"]) for s in open_]
        rows = _probe(runner, [(state.index(s), replace(s["config"], qps_scale=m))
                               for s, m in zip(open_, mids, strict=True)], by_scale)
        for s, mid, row in zip(open_, mids, rows, strict=True):
            s["probes"].append(row)
            if slo.met(row):
                s.update(lo=mid, row=row)
            else:
                s["hi"] = mid
    out = []
    for s in state:
        row = s["row"]
        scale = s["lo"] if row is not None else 0.0
        out.append(Capacity(point=replace(s["config"], qps_scale=scale, verdict=None),
                            qps_scale=scale,
                            rate_rps=row["rate_rps"] if row is not None else 0.0,
                            bounded=s["bounded"], probes=s["probes"]))
    return out


def _probe(runner: Runner, wanted: list[tuple[int, SweepPoint]],
           by_scale: list[dict[float, dict]]) -> list[dict]:
    """The rows of (configuration index, point) pairs: known ones reused, the rest run."""
    rows = [by_scale[i].get(point.qps_scale) for i, point in wanted]
    ran = iter(runner([point for (_, point), row in zip(wanted, rows, strict=True)
                       if row is None]))
    return [row if row is not None else next(ran) for row in rows]


def capacity_records(capacities: list[Capacity], slo: CapacitySlo) -> list[dict]:
    """One row per capacity found: the configuration, the rate it holds the SLO to, the SLO."""
    return [{"policy": c.point.policy, "num_blocks": c.probes[0]["num_blocks"],
             "token_budget": c.probes[0]["token_budget"], "max_num_seqs": c.point.max_num_seqs,
             "capacity_qps_scale": c.qps_scale, "capacity_rate_rps": c.rate_rps,
             "bounded": c.bounded, "probes": len(c.probes),
             "slo_ttft_p99_ms": slo.ttft_p99_ms, "slo_itl_p99_ms": slo.itl_p99_ms}
            for c in capacities]
