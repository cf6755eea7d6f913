"""The engine thread: the scheduler's only owner, stepping on the wall clock.

HTTP handlers never touch the scheduler: `submit` and `abort` put operations in an inbox (a
deque under a Condition) that the thread drains at the top of every iteration, then it runs
one step, Engine.step (the simulator's step; on a wall clock its wait has nothing to do but
read the clock), and hands the new tokens to each request's TokenSink (servelab/serve/handoff.py).
With nothing to do it sleeps on the Condition until a submission arrives. A step whose
backend raises fails the requests in it (FinishReason.FAILED); serving goes on.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, replace

from servelab.serve.handoff import Clock, Draining, Overloaded, StreamEvent, TokenSink, post_events
from servelab.serve.metrics import ServerMetrics
from servelab.serve.request_log import RequestLog, arrival_row_of, row_of
from sim.engine.core import Backend, BatchPlan, FinishReason, Request, StepResult
from sim.engine.scheduler import Scheduler
from sim.engine.step import Engine, run_now

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineThreadConfig:
    """Admission limits of the engine thread."""

    max_waiting: int = 1024  # requests queued (not yet running) before new ones get 503

    def __post_init__(self) -> None:
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the engine thread publishes after every iteration."""

    num_running: int = 0
    num_waiting: int = 0
    num_live: int = 0  # submitted, not yet finished
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    num_failed_steps: int = 0


@dataclass(slots=True)
class _Live:
    request: Request
    sink: TokenSink
    tenant: str | None
    delivered: int = 0  # output tokens handed to the sink so far


class _PlanRecorder:
    """The backend, remembering the plan it runs so a step that raises can be failed, and
    timing the step on the wall clock."""

    def __init__(self, backend: Backend, clock: Clock) -> None:
        self.backend = backend
        self.clock = clock
        self.plan: BatchPlan | None = None
        self.start_s = self.end_s = 0.0  # when the last step was scheduled, and ended

    def execute(self, plan: BatchPlan) -> StepResult:
        self.plan = plan
        result = self.backend.execute(plan)
        # Tokens are stamped when they became available: the step ends now, so it lasted
        # from when it was scheduled (scheduling took time too), not the backend's part alone.
        self.end_s = self.clock.now()
        # (replace keeps every other field: a verifying row's tokens among them)
        return replace(result, duration_s=self.end_s - self.start_s)

    def free(self, request: Request) -> None:
        self.backend.free(request)


def _no_wait(start_s: float, duration_s: float) -> None:  # noqa: ARG001 - sim.engine.step.Wait
    """A wall clock's wait: the backend's execute already took the step's time."""


class EngineThread:
    """Runs the engine step forever on its own thread; the only code touching the scheduler."""

    def __init__(self, scheduler: Scheduler, backend: Backend, clock: Clock,
                 config: EngineThreadConfig | None = None, metrics: ServerMetrics | None = None,
                 request_log: RequestLog | None = None) -> None:
        self.scheduler = scheduler
        self.clock = clock
        self.config = config or EngineThreadConfig()
        self.metrics = metrics
        self.request_log = request_log
        self._backend = _PlanRecorder(backend, clock)
        self.engine = Engine(scheduler, self._backend)
        self._cond = threading.Condition()
        self._ops: deque[tuple] = deque()  # ("add", _Live) | ("abort", id) | ("abort_all", why)
        self._inbox_adds = 0  # adds in _ops; with _waiting, counted against max_waiting
        self._waiting = 0  # the scheduler's waiting queue as of the last iteration
        self._draining = self._stopping = False
        self._idle = True  # the last step had nothing to do: sleep until the inbox fills
        self._live: dict[str, _Live] = {}  # engine thread only
        self._events: list[tuple[TokenSink, StreamEvent]] = []  # engine thread only
        self._drained = threading.Event()  # no request in flight
        self._drained.set()
        self._num_steps = self._failed_steps = 0
        self.stats = EngineStats(kv_blocks_total=scheduler.block_manager.num_blocks)
        self.error: BaseException | None = None  # what killed the thread, if anything
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    # ---- any thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def draining(self) -> bool:
        return self._draining

    def submit(self, request: Request, sink: TokenSink, tenant: str | None = None) -> None:
        """Queue a request; raise Draining or Overloaded instead of queueing past the limits."""
        with self._cond:
            if self._draining or self._stopping or not self._thread.is_alive():
                raise Draining("the server is shutting down")
            if self._inbox_adds + self._waiting >= self.config.max_waiting:
                raise Overloaded(f"{self.config.max_waiting} requests are already waiting")
            self._inbox_adds += 1
            self._drained.clear()
            if self.request_log is not None:
                # Queued before the engine can see the request, so the log gets the arrival
                # ahead of the final row that _finish writes for it.
                self.request_log.write_arrival(
                    arrival_row_of(request, self.clock.start_unix, tenant))
            self._ops.append(("add", _Live(request, sink, tenant)))
            self._cond.notify()

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORTED) -> None:
        """End a request early (its client left: ABORTED; a stop string: STOP); its KV is
        freed at the next iteration."""
        self._push(("abort", request_id, reason))

    def begin_drain(self) -> None:
        """Refuse new requests from now on; the ones in flight go on."""
        with self._cond:
            self._draining = True

    def abort_all(self, detail: str) -> None:
        """Abort every request in flight (drain timeout)."""
        self._push(("abort_all", detail))

    def wait_drained(self, timeout_s: float | None = None) -> bool:
        """Block until no request is in flight; False on timeout."""
        return self._drained.wait(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort whatever is in flight and end the thread."""
        with self._cond:
            self._stopping = self._draining = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _push(self, op: tuple) -> None:
        with self._cond:
            self._ops.append(op)
            self._cond.notify()

    # ---- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                ops, stopping = self._take()
                self._apply(ops)
                if stopping:
                    self._apply([("abort_all", "server stopped")])
                    break
                self._idle = not self._step()
                self._publish()
        except BaseException as exc:  # a scheduler bug: fail what is in flight, say why
            self.error = exc
            log.exception("engine thread died")
            self._fail_all(f"engine thread died: {exc!r}")
        finally:
            self._flush()
            self._publish()

    def _take(self) -> tuple[list[tuple], bool]:
        with self._cond:
            while self._idle and not self._ops and not self._stopping:
                self._cond.wait()
            ops = list(self._ops)
            self._ops.clear()
            self._waiting += self._inbox_adds  # they join the scheduler's queue now
            self._inbox_adds = 0
            return ops, self._stopping

    def _apply(self, ops: list[tuple]) -> None:
        now = self.clock.now()
        for op in ops:
            if op[0] == "add":
                self._add(op[1])
            elif op[0] == "abort":
                self._abort(op[1], op[2], now)
            else:
                for request_id in list(self._live):
                    self._abort(request_id, FinishReason.ABORTED, now, op[1])
        self._flush()

    def _add(self, live: _Live) -> None:
        self._live[live.request.request_id] = live
        if not self.scheduler.add(live.request):  # it can never fit
            self._finish(live, [])

    def _abort(self, request_id: str, reason: FinishReason, now: float, detail: str = "") -> None:
        live = self._live.get(request_id)
        request = self.scheduler.abort(request_id, reason, now)
        if request is not None:
            self._backend.free(request)
        if live is not None and live.request.is_finished:
            self._finish(live, live.request.output_token_ids[live.delivered:], detail)

    def _step(self) -> bool:
        """One engine step; False when there was nothing to do."""
        self._backend.plan = None
        try:
            self._backend.start_s = self.clock.now()
            finished = run_now(self.engine.step(self._backend.start_s, _no_wait))
            if finished is None:
                return False
            self.engine.steps.clear()  # a server runs for days: keep a count, not the rows
            self._num_steps += 1
        except Exception as exc:
            self._fail_step(exc)
            return True
        assert self._backend.plan is not None  # (the step ran it)
        self._deliver(self._backend.plan, finished, self._backend.end_s)
        return True

    def _deliver(self, plan: BatchPlan, finished: list[Request], now: float) -> None:
        done = {request.request_id for request in finished}
        for request in plan.requests:
            live = self._live.get(request.request_id)
            if live is None or len(request.output_token_ids) == live.delivered:
                continue
            new = request.output_token_ids[live.delivered:]
            if self.metrics is not None:
                self.metrics.on_tokens(request, live.delivered)
            live.delivered += len(new)
            rid = request.request_id
            if rid in done:
                self._finish(live, new)
            else:
                self._events.append((live.sink, StreamEvent(new)))
        for request in finished:  # static batching: rows finished earlier, returned now
            live = self._live.get(request.request_id)
            if live is not None:
                self._finish(live, [])
        self._flush()

    def _fail_step(self, exc: Exception) -> None:
        log.exception("step failed; failing its requests")
        self._failed_steps += 1
        plan = self._backend.plan
        requests = plan.requests if plan is not None else list(self.scheduler.running)
        now = self.clock.now()
        for request in requests:
            self._abort(request.request_id, FinishReason.FAILED, now,
                        f"step failed: {type(exc).__name__}: {exc}")
        self._flush()

    def _fail_all(self, detail: str) -> None:
        for live in list(self._live.values()):
            live.request.finish_reason = FinishReason.FAILED
            self._finish(live, [], detail)

    def _finish(self, live: _Live, tokens: list[int], detail: str = "") -> None:
        request = live.request
        del self._live[request.request_id]
        if self.metrics is not None:
            self.metrics.on_finish(request)
        if self.request_log is not None:
            row = row_of(request, self.clock.start_unix, live.tenant)
            self.request_log.write(row, live.sink.mark_durable)
        reason = request.finish_reason or FinishReason.FAILED
        self._events.append(
            (live.sink, StreamEvent(tokens, reason, detail or request.finish_detail)))

    def _flush(self) -> None:
        if self._events:
            events, self._events = self._events, []
            post_events(events)

    def _publish(self) -> None:
        scheduler, bm = self.scheduler, self.scheduler.block_manager
        self.stats = EngineStats(
            num_running=len(scheduler.running), num_waiting=len(scheduler.waiting),
            num_live=len(self._live), kv_blocks_used=bm.num_used_blocks,
            kv_blocks_total=bm.num_blocks, num_preemptions=scheduler.num_preemptions,
            num_steps=self._num_steps, num_failed_steps=self._failed_steps,
        )
        if self.metrics is not None:
            self.metrics.set_state(scheduler)
        with self._cond:
            self._waiting = len(scheduler.waiting)
            if not self._live and not self._inbox_adds:
                self._drained.set()
