"""Closed-loop arrivals: a request is released when the answer it waits for has finished.

A session's turn k is released think_s after turn k-1's last token (its first turn, and a
request outside any session, at its trace time); with `users`, N users run the chains (a
session, or a lone request) one after another in trace order, each starting its next as soon
as its last one finished. This is what the load client does against a live server
(servelab.bench.closed_loop, the same chains from workloads.sessions.chains_of), so a simulated run
and a measured one send the same traffic. A released request's arrival_s becomes its
release time: its TTFT counts from when it was sent, as the client measures it.

The engines' steps feed the loop through the run's on_step (every step's finished requests,
fast-forward runs' included, at their finish_s); each release is a SimPy process that adds its
request at its time, as the open-loop arrival process would have. Until it is released a
request has no arrival time (math.inf), so an SLO watch (sim.replay.verdict) never judges the wait
of a turn still waiting for its previous answer; a run stopped early puts the written times
back on the requests it never released.

`replay` is sim.replay.simulation.run_trace for a trace: its sessions closed-loop unless open_loop,
the one path `simulate`, `sweep`, `plan` and `validate` share.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence

import simpy

from sim.cluster.config import ClusterConfig
from sim.cluster.run import ClusterResult, _Arrival, _Cluster, run_engines
from sim.engine.core import Request
from sim.engine.step import Engine
from sim.replay.simulation import ReplayEnvironment, RunResult, _Replay, collector_paused, run_trace
from workloads.sessions import Chain, chains_of
from workloads.trace import Trace

OnStep = Callable[[float, list[Request]], None]


class ClosedLoop:
    """Which request is released when: `start` the first ones, then `finished` for each
    answer that ends gives the one that waited for it, if any (and when)."""

    def __init__(self, requests: Sequence[Request], chains: list[Chain],
                 think_s: Sequence[float], users: int | None = None,
                 first_send_s: Sequence[float] = ()) -> None:
        if users is not None and users < 1:
            raise ValueError(f"users must be >= 1, got {users}")
        if first_send_s and (users is None or len(first_send_s) != users):
            raise ValueError(f"first_send_s gives one time per user: {len(first_send_s)} "
                             f"for {users} users")
        self.requests, self.think_s, self.users = requests, think_s, users
        self.first_send_s = list(first_send_s) or [0.0] * (users or 0)
        self.queue = deque(chains)  # with users: the chains no user has taken yet
        self.place: dict[int, tuple[Chain, int]] = {}  # id(request) -> its chain, position
        for chain in chains:
            for k, row in enumerate(chain.rows):
                self.place[id(requests[row])] = (chain, k)
        self.written_s: dict[int, float] = {}  # id(request) -> trace time, until released

    def start(self) -> list[tuple[float, Request]]:
        """The requests released without waiting: each chain's first at its trace time, or
        with users, the first chain of each user at its first send (all at once unless
        `first_send_s` said otherwise). Every other request has no arrival time until it is
        released."""
        if self.users is None:
            started = [(chain.start_s, self.requests[chain.rows[0]]) for chain in self.queue]
        else:
            taken = [self.queue.popleft() for _ in range(min(self.users, len(self.queue)))]
            started = [(at_s, self.requests[chain.rows[0]])
                       for at_s, chain in zip(self.first_send_s, taken, strict=False)]
        first = {id(request) for _, request in started}
        for request in self.requests:
            if id(request) in self.place and id(request) not in first:
                self.written_s[id(request)] = request.arrival_s
                request.arrival_s = math.inf
        return started

    def released(self, request: Request, at_s: float) -> None:
        """Give `request` its arrival time: it is sent at `at_s`."""
        self.written_s.pop(id(request), None)
        request.arrival_s = at_s

    def restore_unreleased(self) -> None:
        """Put the trace times back on the requests never released (a run stopped early)."""
        for request in self.requests:
            if id(request) in self.written_s:
                request.arrival_s = self.written_s.pop(id(request))

    def finished(self, request: Request, now: float) -> tuple[float, Request] | None:
        """The request released because `request` ended at `now`, and its release time."""
        place = self.place.pop(id(request), None)
        if place is None:  # not one of the run's requests (a prefill engine's stand-in)
            return None
        chain, k = place
        if k + 1 < len(chain.rows):
            row = chain.rows[k + 1]
            return now + float(self.think_s[row]), self.requests[row]
        if self.users is not None and self.queue:
            return now, self.requests[self.queue.popleft().rows[0]]
        return None


def closed_loop(trace: Trace, requests: Sequence[Request], users: int | None = None,
                open_loop: bool = False) -> ClosedLoop | None:
    """The closed loop of a trace's requests (built by sim.replay.workload.requests_from_trace, in
    row order): its sessions, run by `users` users if given; None when nothing waits for an
    answer (no sessions and no users) or open_loop asks for the arrival times as written."""
    if open_loop:
        if users is not None:
            raise ValueError("--users runs a closed loop; it does not combine with --open-loop")
        return None
    if not trace.has_sessions and users is None:
        return None
    table = trace.table
    if trace.has_sessions:
        sessions, turns = table["session_id"].tolist(), table["turn"].tolist()
        think_s = table["think_s"].tolist()
    else:
        sessions, turns, think_s = [None] * len(trace), [0] * len(trace), [0.0] * len(trace)
    chains = chains_of(sessions, turns, trace.arrival_s.tolist())
    return ClosedLoop(requests, chains, think_s, users)


def replay(trace: Trace, requests: Sequence[Request], engine: Engine,
           on_step: OnStep | None = None, open_loop: bool = False) -> RunResult:
    """sim.replay.simulation.run_trace over a trace's requests
    (sim.replay.workload.requests_from_trace,
    in row order): its sessions closed-loop, as `simulate` runs them, unless open_loop."""
    loop = closed_loop(trace, requests, open_loop=open_loop)
    if loop is None:
        return run_trace(requests, engine, on_step=on_step)
    return run_closed_trace(requests, engine, loop, on_step)


def run_closed_trace(requests: Sequence[Request], engine: Engine, loop: ClosedLoop,
                     on_step: OnStep | None = None) -> RunResult:
    """sim.replay.simulation.run_trace with the loop's arrivals instead of the trace's times."""
    engine.start_fast_forward()
    env = ReplayEnvironment()
    replay = _ClosedReplay(env, requests, engine, on_step, loop)
    try:
        for at_s, request in loop.start():
            replay.release(at_s, request)
        with collector_paused():
            env.run(until=env.process(replay.stepping()))
    finally:
        env.close()
        loop.restore_unreleased()
    scheduler = engine.scheduler
    return RunResult(requests=list(requests), steps=engine.steps,
                     num_preemptions=scheduler.num_preemptions,
                     num_blocks=scheduler.config.num_blocks,
                     max_num_seqs=scheduler.config.max_num_seqs)


def run_closed_cluster(requests: Sequence[Request], engines: Sequence[Engine],
                       config: ClusterConfig, loop: ClosedLoop, on_step: OnStep | None = None
                       ) -> ClusterResult:
    """sim.cluster.run.run_cluster with the loop's arrivals instead of the trace's times."""
    if len(engines) != config.num_engines:
        raise ValueError(f"cluster of {config.num_engines} engines given {len(engines)}")
    for engine in engines:
        engine.start_fast_forward()
    env = ReplayEnvironment()
    cluster = _ClosedCluster(env, list(engines), config, on_step, loop)
    try:
        for at_s, request in loop.start():
            cluster.release(at_s, request)
        return run_engines(env, cluster, requests)
    finally:
        loop.restore_unreleased()


def _feeding(loop: ClosedLoop, release: Callable[[float, Request], None],
             on_step: OnStep | None) -> OnStep:
    """An on_step that hands every finished request to the loop, then calls on_step."""
    def fed(now: float, finished: list[Request]) -> None:
        for request in finished:
            # finish_s: when its last token came (fast-forwarded rows finish at their own step).
            _answered(loop, release, request, request.finish_s if request.finish_s is not None
                      else now)
        if on_step is not None:
            on_step(now, finished)
    return fed


def _answered(loop: ClosedLoop, release: Callable[[float, Request], None], request: Request,
              now: float) -> None:
    """Release what waited for `request`, which ended at `now`."""
    released = loop.finished(request, now)
    if released is not None:
        release(*released)


class _ClosedReplay(_Replay):
    """One engine's replay whose arrivals come from the loop: the engine steps as in
    run_trace, next_arrival_s being the earliest release still to come."""

    def __init__(self, env: simpy.Environment, requests: Sequence[Request], engine: Engine,
                 on_step: OnStep | None, loop: ClosedLoop) -> None:
        self.loop = loop
        self.due: list[float] = []  # a heap: when the scheduler sees each pending release
        super().__init__(env, requests, engine, _feeding(loop, self.release, on_step))

    def _set_next_arrival(self) -> None:
        self.next_arrival_s = self.due[0] if self.due else math.inf

    def release(self, at_s: float, request: Request) -> None:
        self.loop.released(request, at_s)
        due_s = at_s + self.delay_s
        heapq.heappush(self.due, due_s)
        self._set_next_arrival()
        self.env.process(self._arrive(due_s, request))

    def _arrive(self, due_s: float, request: Request):
        env = self.env
        if due_s > env.now:
            yield env.timeout(due_s - env.now)
        heapq.heappop(self.due)  # releases land in time order: this one is the earliest
        added = self.engine.add(request, env.now)
        self.arrived += 1
        self._set_next_arrival()
        if not added:  # rejected at once: what waited for it goes now
            _answered(self.loop, self.release, request, env.now)
        if self.wake:
            self.wake.pop().succeed()


class _ClosedCluster(_Cluster):
    """A cluster replay whose arrivals come from the loop (routed at their release time)."""

    interrupts_cuts = True  # its on_step starts a release process per answered request

    def __init__(self, env: simpy.Environment, engines: list[Engine], config: ClusterConfig,
                 on_step: OnStep | None, loop: ClosedLoop) -> None:
        self.loop = loop
        super().__init__(env, engines, config, _feeding(loop, self.release, on_step))

    def release(self, at_s: float, request: Request) -> None:
        self.loop.released(request, at_s)
        self.env.process(self._arrive(at_s + self.delay_s, request))

    def _arrive(self, due_s: float, request: Request):
        env = self.env
        if due_s > env.now:
            yield _Arrival(env, due_s - env.now)
        self.enter(request)
        if request.is_finished:  # rejected at once: what waited for it goes now
            _answered(self.loop, self.release, request, env.now)
