"""QPS sweeps and capacity search: the simulator over a grid of scheduler configurations.

A sweep point is one (policy, rate, KV pool, token budget, slot count) run of a trace; its
row is the run's summary. Points are independent, so a runner (servelab.sweeps.runners) may compute
them
in any order on any worker: the simulation is deterministic and gives the same row anywhere.

Capacity follows Sarathi-Serve: the largest rate whose p99 TTFT and p99 time between tokens
(ITL) both meet their targets, found per configuration by bisection on the rate.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict, dataclass, replace

from servelab.sweeps.stream import Search, as_stream, drive
from sim.cluster.closed_loop import closed_loop
from sim.cluster.config import ClusterConfig
from sim.engine.core import Backend, Request
from sim.engine.scheduler_config import SchedulerConfig
from sim.policy_runs import run_deployment
from sim.replay.metrics import Slo, summarize
from sim.replay.simulation import collector_paused
from sim.replay.verdict import SloWatch
from sim.replay.workload import requests_from_trace
from sim.specs.engine_limits import ENGINE_DEFAULTS
from workloads.trace import Trace
from workloads.transforms import scale_qps

# The rate multipliers a sweep runs by default: where the conv trace goes from light load to
# overload on the default deployment.
DEFAULT_QPS_SCALES = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0)
REL_TOL = 0.05  # a capacity search ends when its bracket is this narrow (relative)


@dataclass(frozen=True)
class SweepPoint:
    """One configuration at one rate; None limits mean the deployment's default."""

    policy: str
    qps_scale: float
    num_blocks: int | None = None
    token_budget: int | None = None
    max_num_seqs: int = ENGINE_DEFAULTS.max_num_seqs
    # Stop the run once it certainly misses this SLO (sim.replay.verdict); None: run to the end.
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
    block_size: int = ENGINE_DEFAULTS.block_size
    max_model_len: int = ENGINE_DEFAULTS.max_model_len
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
         max_num_seqs: Sequence[int] = (ENGINE_DEFAULTS.max_num_seqs,)) -> list[SweepPoint]:
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
    summary, stopped_s = replay_summary(trace, config, context.backend, context.cluster,
                                        point.verdict, context.open_loop, context.slo)
    row = point_row(context, point)
    if point.verdict is not None:
        row["stopped_s"] = stopped_s
    row.update(summary)
    return row


def replay_summary(trace: Trace, config: SchedulerConfig, backend: Backend,
                   cluster: ClusterConfig | None, verdict: CapacitySlo | None,
                   open_loop: bool, slo: Slo | None = None) -> tuple[dict, float | None]:
    """Replay the trace as `simulate` does (its sessions closed-loop unless open_loop),
    stopped once it certainly misses `verdict`: its summary and when it stopped (None: it
    ran to the end). Everything the replay builds, its requests included, is freed by
    reference counting before the cyclic collector runs again, so no collector pass scans
    it (a search runs many replays, most of them stopped with their queues full)."""
    def replay() -> tuple[dict, float | None]:
        requests = requests_from_trace(trace)
        loop = closed_loop(trace, requests, open_loop=open_loop)
        result, _ = run_deployment(requests, config, backend, cluster,
                                   verdict_watch(requests, verdict, config), loop)
        return summarize(result, slo), result.stopped_s

    with collector_paused():
        return replay()


def point_row(context: SweepContext, point: SweepPoint) -> dict:
    """A point's row before its summary: the point, the resolved limits, the rate."""
    config = context.config(point)
    row = asdict(point)
    del row["verdict"]
    row.update(num_blocks=config.num_blocks, token_budget=config.budget,
               rate_rps=rate_rps(context.trace, point.qps_scale))
    return row


def rate_rps(trace: Trace, qps_scale: float) -> float:
    """The request rate of `trace` scaled by qps_scale, as a run at that scale reports it."""
    if qps_scale != 1:
        trace = scale_qps(trace, qps_scale)
    return len(trace) / trace.span_s if trace.span_s > 0 else math.inf


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
    probes: list[dict]  # the row that decided each probe: run, reused, or implying it
    implied: int = 0  # probes decided by a known row at another rate (not run)


def check_range(low: float, high: float, rel_tol: float = REL_TOL) -> None:
    """A capacity search's range and tolerance, or a ValueError naming the bad one."""
    if not 0 < low < high:
        raise ValueError(f"capacity search needs 0 < low < high, got {low}, {high}")
    if not rel_tol > 0:
        raise ValueError(f"rel_tol must be > 0, got {rel_tol}")


def find_capacity(runner: Runner, configs: Sequence[SweepPoint], slo: CapacitySlo,
                  low: float, high: float, rel_tol: float = REL_TOL,
                  stop_early: bool = True,
                  known: Sequence[Sequence[dict]] | None = None,
                  rate_of: Callable[[float], float] | None = None) -> list[Capacity]:
    """Bisect (geometrically) each configuration's rate in [low, high] to within rel_tol;
    stop_early: each probe stops once it certainly misses the SLO (the same verdicts);
    known: rows each configuration already ran (a sweep's), reused for a probe at the
    same qps_scale instead of running it again (a run is deterministic); rate_of (the
    request rate at a qps scale): given, a probe whose verdict a known row implies is not
    run either (see _deciding), and the bisection takes the same path.

    The configurations are searched side by side (servelab.sweeps.stream.drive), one probe each at
    a time, a pool's workers each starting one as soon as it is free. Latency is assumed to
    grow with the rate, which holds for these schedulers except within noise of a knee.
    """
    check_range(low, high, rel_tol)
    verdict = slo if stop_early else None
    known = list(known) if known is not None else [()] * len(configs)
    if len(known) != len(configs):
        raise ValueError(f"known has rows for {len(known)} of {len(configs)} configurations")
    stream = as_stream(runner)
    searches = [bisect_rate(replace(c, verdict=verdict), slo, low, high, rel_tol, rows,
                            rate_of) for c, rows in zip(configs, known, strict=True)]
    return drive(stream, searches, stream.slots)


def bisect_rate(config: SweepPoint, slo: CapacitySlo, low: float, high: float,
                rel_tol: float, known: Sequence[dict] = (),
                rate_of: Callable[[float], float] | None = None) -> Search:
    """One configuration's capacity search (find_capacity's), as a servelab.sweeps.stream Search."""
    imply = rate_of is not None
    ((lo_row, lo_implied), (hi_row, hi_implied)) = yield from _decided(
        [replace(config, qps_scale=s) for s in (low, high)], known, slo, imply)
    search = {"config": config, "hi": high, "probes": [lo_row, hi_row], "bounded": "",
              "implied": lo_implied + hi_implied}
    if slo.met(hi_row):
        search.update(lo=high, row=hi_row, row_implied=hi_implied, bounded="above-range")
    elif slo.met(lo_row):
        search.update(lo=low, row=lo_row, row_implied=lo_implied)
    else:
        search.update(lo=low, row=None, bounded="below-range")
    while not search["bounded"] and search["hi"] / search["lo"] > 1 + rel_tol:
        mid = math.sqrt(search["lo"] * search["hi"])
        ((row, implied),) = yield from _decided([replace(config, qps_scale=mid)], known, slo,
                                                imply)
        search["probes"].append(row)
        search["implied"] += implied
        if slo.met(row):
            search.update(lo=mid, row=row, row_implied=implied)
        else:
            search["hi"] = mid
    return _capacity(search, rate_of)


def _capacity(search: dict, rate_of: Callable[[float], float] | None) -> Capacity:
    row, scale = search["row"], search["lo"]
    if row is None:
        rate, scale = 0.0, 0.0
    else:  # (a row that implied the verdict ran at another rate)
        rate = rate_of(scale) if search["row_implied"] else row["rate_rps"]
    return Capacity(point=replace(search["config"], qps_scale=scale, verdict=None),
                    qps_scale=scale, rate_rps=rate, bounded=search["bounded"],
                    probes=search["probes"], implied=search["implied"])


def _decided(points: list[SweepPoint], known: Sequence[dict], slo: CapacitySlo,
             imply: bool) -> Generator[list[SweepPoint], list[dict], list[tuple[dict, bool]]]:
    """The rows of points, each with whether a known row at another rate implied it: known
    ones deciding them reused, the rest run (yielded to the search's driver)."""
    rows = [_deciding(known, point.qps_scale, slo, imply) for point in points]
    ran = iter((yield [point for point, row in zip(points, rows, strict=True) if row is None]))
    return [(next(ran), False) if row is None else (row, row["qps_scale"] != point.qps_scale)
            for point, row in zip(points, rows, strict=True)]


def _deciding(rows: Sequence[dict], scale: float, slo: CapacitySlo, imply: bool
              ) -> dict | None:
    """A known row that decides a probe at `scale`: one run at that rate, or with imply,
    the lowest that fails below it (more load only adds latency: it fails too) or the
    highest that holds above it (it holds too). Only rows that agree with that (none
    holds above one that fails) imply anything."""
    for row in rows:
        if row["qps_scale"] == scale:
            return row
    if not imply or not rows:
        return None
    failing = [r for r in rows if not slo.met(r)]
    holding = [r for r in rows if slo.met(r)]
    lowest_fail = min(failing, key=lambda r: r["qps_scale"], default=None)
    highest_hold = max(holding, key=lambda r: r["qps_scale"], default=None)
    if (lowest_fail is not None and highest_hold is not None
            and highest_hold["qps_scale"] > lowest_fail["qps_scale"]):
        return None
    if lowest_fail is not None and lowest_fail["qps_scale"] < scale:
        return lowest_fail
    if highest_hold is not None and highest_hold["qps_scale"] > scale:
        return highest_hold
    return None


def capacity_records(capacities: list[Capacity], slo: CapacitySlo) -> list[dict]:
    """One row per capacity found: the configuration, the rate it holds the SLO to, the SLO."""
    return [{"policy": c.point.policy, "num_blocks": c.probes[0]["num_blocks"],
             "token_budget": c.probes[0]["token_budget"], "max_num_seqs": c.point.max_num_seqs,
             "capacity_qps_scale": c.qps_scale, "capacity_rate_rps": c.rate_rps,
             "bounded": c.bounded, "probes": len(c.probes),
             "slo_ttft_p99_ms": slo.ttft_p99_ms, "slo_itl_p99_ms": slo.itl_p99_ms}
            for c in capacities]
