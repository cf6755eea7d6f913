"""A cluster in one SimPy environment: replicas behind a router, or prefill and decode pools.

Each engine (its own scheduler and KV pool) is a SimPy process stepping on the shared clock;
an arrival process routes each request at its arrival time by a snapshot of every replica.
Under prefill/decode disaggregation a request is first prefilled on a prefill engine, then
its prompt's KV crosses the prefill engine's link (bytes / bandwidth, one transfer at a time;
the prefill engine keeps those blocks until then) to a decode engine the router picks among
the decode pool, which computes the last prompt token (the first decode step) and samples the
first token: TTFT includes all of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import simpy

from sim.cluster.config import ClusterConfig
from sim.cluster.router import ReplicaLoad, Router
from sim.engine.core import Request, request_overhead_s
from sim.engine.fast_forward_run import FastForwardRun
from sim.engine.step import Engine
from sim.engine.step_log import StepLog
from sim.replay.simulation import ReplayEnvironment, RunResult, StalledError, collector_paused


@dataclass
class ClusterResult:
    """Every request, and each engine's role, steps and the requests it served."""

    requests: list[Request]
    roles: list[str]
    engines: list[Engine]
    served: list[list[Request]]  # per engine: requests routed to it (P/D: the originals)
    transfer_s: list[float] = field(default_factory=list)  # per P/D request: link time

    def run_result(self) -> RunResult:
        """The whole cluster as one run: the summary keys keep their single-engine meaning,
        step statistics pool every engine's steps."""
        steps = StepLog.concat(engine.steps for engine in self.engines)
        config = self.engines[0].scheduler.config
        return RunResult(
            requests=self.requests, steps=steps,
            num_preemptions=sum(e.scheduler.num_preemptions for e in self.engines),
            num_blocks=config.num_blocks, max_num_seqs=config.max_num_seqs,
        )


def run_cluster(requests: Sequence[Request], engines: Sequence[Engine], config: ClusterConfig,
                on_step: Callable[[float, list[Request]], None] | None = None) -> ClusterResult:
    """Replay requests (sorted by arrival_s) through the cluster until all have finished
    (each engine fast-forwarding its decode rows as in sim.replay.simulation.run_trace)."""
    if len(engines) != config.num_engines:
        raise ValueError(f"cluster of {config.num_engines} engines given {len(engines)}")
    for engine in engines:
        engine.start_fast_forward()
    env = ReplayEnvironment()
    cluster = _Cluster(env, list(engines), config, on_step)
    env.process(cluster.arrivals(requests))
    return run_engines(env, cluster, requests)


def run_engines(env: ReplayEnvironment, cluster: _Cluster, requests: Sequence[Request]
                ) -> ClusterResult:
    """Step every engine of `cluster` until the environment runs dry (then closed); its
    result, or StalledError naming how many requests never finished."""
    engines = cluster.engines
    cluster.processes = [env.process(cluster.stepping(i)) for i in range(len(engines))]
    try:
        with collector_paused():
            env.run()
    finally:
        env.close()
    stuck = sum(not r.is_finished for r in requests)
    if stuck:
        raise StalledError(f"t={env.now:.3f}s: {stuck} requests never finished")
    return ClusterResult(list(requests), cluster.config.roles(), list(engines), cluster.served,
                         cluster.transfers)


class _Cluster:
    """The processes of one cluster replay: arrivals, one stepping loop per engine, and a
    KV hand-off per disaggregated request."""

    interrupts_cuts = False  # whether its on_step starts processes (_cut interrupts then)

    def __init__(self, env: simpy.Environment, engines: list[Engine], config: ClusterConfig,
                 on_step: Callable[[float, list[Request]], None] | None) -> None:
        self.env, self.engines, self.config, self.on_step = env, engines, config, on_step
        self.router = Router(config.router)
        # Decode engines get their own router: its turn counter must not follow arrivals.
        self.decode_router = Router(config.router)
        self.wake: list[simpy.Event | None] = [None] * len(engines)
        # Fast-forward runs (sim.engine.fast_forward_run) of engines whose decode rows are
        # fast-forwarded. A run cut by a request ends where stepping one event at a time would
        # have, as long as a request that joins the engine at the instant one of its steps
        # ends comes before that step's end: arrivals are delivered first at equal times
        # (_Arrival), and a decode engine's steps end after every other event due at the same
        # time (LATE), the KV hand-offs that bring its requests included. (A prefill engine
        # has no such runs: its requests end at once.) The run each sleeps through:
        self.runs: list[FastForwardRun | None] = [None] * len(engines)
        self.run_ends: list[simpy.Event | None] = [None] * len(engines)  # when it wakes from it
        self.processes: list[simpy.Process] = []
        # Each engine's running + waiting count, as least-requests reads it: recounted when
        # a request joins it or a step of it is applied (planning a step only moves requests
        # between its queues), instead of for every engine at every arrival.
        self.queued = [0] * len(engines)
        self.served: list[list[Request]] = [[] for _ in engines]
        self.transfers: list[float] = []
        pools = range(len(engines))
        self.entry = list(pools[:config.num_prefill]) if config.disaggregated else list(pools)
        self.decode = list(pools[config.num_prefill:]) if config.disaggregated else []
        self.pool_engines = {id(pool): [engines[i] for i in pool]
                             for pool in (self.entry, self.decode)}
        self.links = {i: simpy.Resource(env, capacity=1) for i in pools[:config.num_prefill]}
        for i in self.links:  # a prompt's KV stays on its prefill engine until it is sent
            engines[i].scheduler.keep_finished_kv = True
        self.origin: dict[int, Request] = {}  # id(prefill stand-in) -> the request it serves
        # A server's path from the socket to its scheduler (a calibration from a URL
        # measures it): each engine sees a request this much after it arrived.
        self.delay_s = request_overhead_s(engines[0].backend)

    def arrivals(self, requests: Sequence[Request]):
        env = self.env
        for request in requests:
            delay = request.arrival_s + self.delay_s - env.now
            if delay > 0:
                yield _Arrival(env, delay)
            self.enter(request)

    def enter(self, request: Request) -> None:
        """Route a request that arrives now and queue it (rejected at once if it never fits)."""
        index = self._route(self.router, self.entry, request)
        self.served[index].append(request)
        if not self.decode:  # co-located
            self._add(index, request)
            return
        stand_in = _prefill_stand_in(request)
        if self._add(index, stand_in):
            self.origin[id(stand_in)] = request
        else:  # it can never fit: rejected at once, as a single engine would
            _copy_finish(stand_in, request)

    def _route(self, router: Router, pool: list[int], request: Request) -> int:
        """The engine (an index into self.engines) router picks from pool for request."""
        if not router.needs_loads:
            return pool[router.choose(request.prompt_len, len(pool))]
        # Each snapshot costs what it reads; a cluster takes one per replica per arrival,
        # so the counts are kept as they change (self.queued), and the KV usage and the
        # prefix match are read only by routers that use them.
        if router.needs_counts_only:
            queued = self.queued  # (co-located: the pool is every engine, in order)
            return pool[router.least_queued(queued if len(pool) == len(queued)
                                            else [queued[i] for i in pool])]
        engines = self.pool_engines[id(pool)]
        if router.needs_kv:  # fast-forward runs show their blocks as of now
            for run in self.runs:
                if run is not None:
                    run.apply(self.env.now)
        # (a request an engine holds for its step after next waits there too)
        if router.needs_prefix:
            loads = [ReplicaLoad(len(e.scheduler.running), len(e.scheduler.waiting) + len(e.held),
                                 e.scheduler.block_manager.usage,
                                 len(e.scheduler.block_manager.cached_prefix(request))
                                 * e.scheduler.block_manager.block_size) for e in engines]
        else:
            loads = [ReplicaLoad(len(e.scheduler.running), len(e.scheduler.waiting) + len(e.held),
                                 e.scheduler.block_manager.usage) for e in engines]
        return pool[router.choose(request.prompt_len, loads)]

    def _add(self, index: int, request: Request) -> bool:
        """Queue request on engine index and wake it; False if the engine rejected it."""
        run = self.runs[index]
        if run is not None:  # its steps up to now are recorded with the queue they had
            run.apply(self.env.now)
        engine = self.engines[index]
        added = engine.add(request, self.env.now)
        self.queued[index] = _queued(engine)
        if not added:
            return False
        if run is not None:  # the next step admits it: the run ends with the one in progress
            run.cut(self.env.now)
            self.runs[index] = None
            self._cut(index, run.ends[-1])
        self._wake(index)
        return True

    def _cut(self, index: int, end_s: float) -> None:
        """Wake engine index, asleep through a fast-forward run, at end_s instead of at its end.

        Its process moves to a timeout made now; the old one fires with no one waiting, as
        an interrupted process's would. An interrupt makes the same timeout once delivered,
        and until then only interrupts of engines cut earlier at this instant come first
        (an arrival or a hand-off makes no timeout after its request joins), so events keep
        their order. Where the step hook starts processes whose events come in between (a
        closed loop's releases: interrupts_cuts), the process is interrupted instead
        (tests/sim/replay/test_replay_shortcuts.py compares the two)."""
        if self.interrupts_cuts:
            self.processes[index].interrupt()
            return
        old = self.run_ends[index]
        new = self._timeout(index)(end_s - self.env.now)
        new.callbacks, old.callbacks = old.callbacks, []
        self.run_ends[index] = new

    def _timeout(self, index: int) -> Callable[[float], simpy.Event]:
        """What makes the event at which a step (or a fast-forward run) of engine index ends, given
        the delay: a plain SimPy timeout, LATE for a decode engine of P/D."""
        if self.config.disaggregated and index >= self.config.num_prefill:
            return partial(_Timeout, self.env, priority=LATE)
        return self.env.timeout

    def _wake(self, index: int) -> None:
        """Wake engine index if it sleeps (idle, or waiting for KV to come free)."""
        event = self.wake[index]
        if event is not None:
            self.wake[index] = None
            event.succeed()

    def stepping(self, index: int):
        env, engine, queued = self.env, self.engines[index], self.queued
        prefill = self.config.disaggregated and index < self.config.num_prefill
        # The engine's clock (SimPy's may be a rounding off after a fast-forward run).
        now = end_s = env.now
        timeout = self._timeout(index)

        def wait(start_s: float, duration_s: float) -> simpy.Event:  # (sim.engine.step.Wait)
            nonlocal end_s
            end_s = start_s + duration_s
            return timeout(duration_s if env.now == start_s else end_s - env.now)

        while True:
            run = FastForwardRun.start(engine, now, self.on_step)
            if run is not None:  # (an arrival that cuts it wakes the engine sooner: _cut)
                self.runs[index] = run
                self.run_ends[index] = wake = timeout(run.ends[-1] - env.now)
                try:
                    yield wake
                except simpy.Interrupt:  # cut by a request: wait out the step in progress
                    yield timeout(run.ends[-1] - env.now)
                self.runs[index] = self.run_ends[index] = None
                run.finish()
                queued[index] = _queued(engine)
                now = run.ends[-1]
                continue
            finished = yield from engine.step(now, wait)
            queued[index] = _queued(engine)
            if finished is None:  # idle: sleep until a request is routed here
                self.wake[index] = env.event()
                yield self.wake[index]
                now = env.now
                continue
            now = end_s
            if prefill:
                for stand_in in finished:
                    env.process(self._hand_off(index, stand_in))
            if self.on_step is not None:
                self.on_step(now, finished)

    def _hand_off(self, index: int, stand_in: Request):
        """Move a prefilled prompt's KV to a decode engine, then queue the request there."""
        request = self.origin.pop(id(stand_in))
        if not stand_in.token_times_s:  # it ended without its prompt computed
            _copy_finish(stand_in, request)  # (it kept no KV: only a sampled token keeps it)
            return
        transfer_s = self.config.transfer_s(request.prompt_len)
        with self.links[index].request() as link:
            yield link
            yield self.env.timeout(transfer_s)
        self.transfers.append(transfer_s)
        self.engines[index].scheduler.release_kv(stand_in.request_id)
        self._wake(index)  # a prompt that waited for those blocks may start now
        request.first_scheduled_s = stand_in.first_scheduled_s
        request.num_cached_tokens = stand_in.num_cached_tokens
        request.num_preemptions = stand_in.num_preemptions
        # The decode engine computes only the last prompt token: the first decode step.
        request.num_external_tokens = request.prompt_len - 1
        target = self._route(self.decode_router, self.decode, request)
        self.served[target].append(request)
        self._add(target, request)


# After SimPy's NORMAL events at equal times: a decode engine's step ends (_Cluster._timeout).
LATE = simpy.core.NORMAL + 1


class _Timeout(simpy.Event):
    """A timeout of the given priority: among events due at the same time, those of a
    lower priority come first, whichever event was made first."""

    def __init__(self, env: simpy.Environment, delay: float, priority: int) -> None:
        super().__init__(env)
        self._ok, self._value = True, None  # triggered, as simpy's Timeout sets itself
        env.schedule(self, priority, delay)


class _Arrival(_Timeout):
    """A timeout delivered before every other event due at the same time: a request that
    arrives as a step ends is seen by the step after it, whichever event was made first."""

    def __init__(self, env: simpy.Environment, delay: float) -> None:
        super().__init__(env, delay, simpy.core.URGENT)


def _prefill_stand_in(request: Request) -> Request:
    """The request as a prefill engine runs it: the same prompt, one token to produce."""
    return Request(request.request_id, request.arrival_s, request.prompt_len, 1,
                   prompt_token_ids=request.prompt_token_ids, sampling=request.sampling,
                   prefix_hash_ids=request.prefix_hash_ids,
                   prefix_hash_tokens=request.prefix_hash_tokens)


def _copy_finish(source: Request, target: Request) -> None:
    target.status = source.status
    target.finish_reason = source.finish_reason
    target.finish_detail = source.finish_detail
    target.finish_s = source.finish_s


def _queued(engine: Engine) -> int:
    """An engine's requests running, waiting or held (least-requests' count)."""
    scheduler = engine.scheduler
    return len(scheduler.running) + len(scheduler.waiting) + len(engine.held)
