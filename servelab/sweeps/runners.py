"""Where sweep points run: this process, a local process pool, or a Ray cluster.

Each runner maps points to rows in order with a task (context, point) -> row, run_point by
default, and ships the shared context (the trace and the cost model) to a worker once, not
once per point. The capacity planner runs its own points through the same runners, one at
a time (submit, then wait for any), so that each worker starts its next point as soon as
it is free, chosen from every row so far.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from tqdm import tqdm

from servelab.sweeps.grid import run_point

Task = Callable[[Any, Any], dict]  # (context, point) -> row; a module-level function
_CONTEXT: Any = None  # a pool worker's copy of the context, set by its initializer
_TASK: Task = run_point


def _init_worker(context: Any, task: Task) -> None:
    global _CONTEXT, _TASK
    _CONTEXT, _TASK = context, task


def _run_in_worker(point: Any) -> dict:
    assert _CONTEXT is not None, "pool worker started without a sweep context"
    return _TASK(_CONTEXT, point)


class Tally:
    """Runs a runner started, how many of them stopped early (certain to miss their SLO),
    and how many a search skipped; a progress bar per batch shows them, with the batch's
    time left."""

    def __init__(self, progress: bool) -> None:
        self.progress = progress
        self.started = self.stopped = self.skipped = 0
        self._stream: tqdm | None = None  # the bar of points submitted one at a time

    def start_one(self) -> None:
        """A point submitted on its own started: the stream's bar grows by one."""
        if self._stream is None:
            self._stream = self.bar(0)
        self.started += 1
        self._stream.total += 1
        self._stream.refresh()

    def done_one(self, row: dict) -> None:
        """A point submitted on its own finished."""
        self.done(self._stream, row)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()

    @property
    def counts(self) -> dict[str, int]:
        return {"started": self.started, "stopped": self.stopped, "skipped": self.skipped}

    def bar(self, total: int) -> tqdm:
        self.started += total
        bar = tqdm(total=total, unit="run", file=sys.stderr, leave=False,
                   disable=None if self.progress else True)
        bar.set_postfix(stopped=self.stopped, skipped=self.skipped, refresh=False)
        return bar

    def done(self, bar: tqdm, row: dict) -> None:
        """One run finished: count it (stopped_s set: stopped early) and advance the bar."""
        self.stopped += row.get("stopped_s") is not None
        bar.set_postfix(stopped=self.stopped, skipped=self.skipped, refresh=False)
        bar.update(1)


class LocalRunner:
    """Points on `workers` local processes (1: in this process)."""

    def __init__(self, context: Any, workers: int | None = None,
                 progress: bool = False, task: Task = run_point) -> None:
        self.workers = workers if workers is not None else (os.cpu_count() or 1)
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        self.context = context
        self.task = task
        self.tally = Tally(progress)
        self._pool: ProcessPoolExecutor | None = None

    @property
    def counts(self) -> dict[str, int]:
        """Runs started, stopped early and skipped so far."""
        return self.tally.counts

    @property
    def slots(self) -> int:
        return self.workers

    def skip(self, num_runs: int) -> None:
        """Count runs a search decided not to start."""
        self.tally.skipped += num_runs

    def __enter__(self) -> LocalRunner:
        if self.workers > 1:
            method = "fork" if os.name == "posix" else "spawn"
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context(method),
                initializer=_init_worker, initargs=(self.context, self.task))
        return self

    def __exit__(self, *exc) -> None:
        self.tally.close()
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def submit(self, point: Any) -> Future:
        """Start one point (in this process: run it now); its row comes from wait."""
        self.tally.start_one()
        if self._pool is not None:
            return self._pool.submit(_run_in_worker, point)
        future: Future = Future()
        future.set_result(self.task(self.context, point))
        return future

    def wait(self, handles: Sequence[Future]) -> list[tuple[Future, dict]]:
        """Block until one of the handles finished; every finished one with its row."""
        done, _ = wait(handles, return_when=FIRST_COMPLETED)
        finished = [(h, h.result()) for h in handles if h in done]
        for _, row in finished:
            self.tally.done_one(row)
        return finished

    def __call__(self, points: Sequence[Any]) -> list[dict]:
        tally = self.tally
        with tally.bar(len(points)) as bar:
            if self._pool is None:
                rows = []
                for point in points:
                    rows.append(self.task(self.context, point))
                    tally.done(bar, rows[-1])
                return rows
            futures = [self._pool.submit(_run_in_worker, p) for p in points]
            for future in futures:
                future.add_done_callback(
                    lambda f: tally.done(bar, f.result()) if f.exception() is None else None)
            return [f.result() for f in futures]


class RayRunner:
    """Points as Ray tasks: `address` "auto" finds a running cluster (RAY_ADDRESS, or one
    started on this machine) or else starts a local instance; anything else is the
    address of a cluster, whose workers need servelab installed. At most `workers` tasks
    are in flight (default: as many as the cluster schedules).
    """

    def __init__(self, context: Any, address: str, workers: int | None = None,
                 progress: bool = False, task: Task = run_point) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ValueError("--ray needs Ray installed: pip install 'servelab[ray]'") from exc
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._ray = ray
        self.address = address
        self.workers = workers
        self.context = context
        self.task = task
        self.tally = Tally(progress)

    @property
    def counts(self) -> dict[str, int]:
        """Runs started, stopped early and skipped so far."""
        return self.tally.counts

    def skip(self, num_runs: int) -> None:
        """Count runs a search decided not to start."""
        self.tally.skipped += num_runs

    @property
    def slots(self) -> int:
        """workers, or as many as the cluster has CPUs."""
        return self.workers or max(int(self._ray.cluster_resources().get("CPU", 1)), 1)

    def __enter__(self) -> RayRunner:
        ray = self._ray
        address = None if self.address == "auto" else self.address
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self._context_ref = ray.put(self.context)
        self._task = ray.remote(num_cpus=1)(self.task)
        return self

    def __exit__(self, *exc) -> None:
        self.tally.close()
        self._ray.shutdown()

    def submit(self, point: Any) -> Any:
        """Start one point as a task; its row comes from wait."""
        self.tally.start_one()
        return self._task.remote(self._context_ref, point)

    def wait(self, handles: Sequence[Any]) -> list[tuple[Any, dict]]:
        """Block until one of the tasks finished; it with its row."""
        done, _ = self._ray.wait(list(handles), num_returns=1)
        finished = list(zip(done, self._ray.get(done), strict=True))
        for _, row in finished:
            self.tally.done_one(row)
        return finished

    def __call__(self, points: Sequence[Any]) -> list[dict]:
        limit = self.workers or len(points)
        refs: list = []
        in_flight: list = []
        tally = self.tally
        with tally.bar(len(points)) as bar:
            for point in points:
                if len(in_flight) >= limit:
                    done, in_flight = self._ray.wait(in_flight, num_returns=1)
                    for row in self._ray.get(done):
                        tally.done(bar, row)
                refs.append(self._task.remote(self._context_ref, point))
                in_flight.append(refs[-1])
            while in_flight:
                done, in_flight = self._ray.wait(in_flight, num_returns=1)
                for row in self._ray.get(done):
                    tally.done(bar, row)
        return self._ray.get(refs)
