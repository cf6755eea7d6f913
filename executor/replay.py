"""A measured run: trace requests through the Scheduler with the real model executing steps."""

from __future__ import annotations

from collections.abc import Callable

from executor.backend import ModelBackend
from executor.model import Transformer
from executor.prompts import attach_prompt_tokens
from executor.speculative.drafter import build_drafter
from sim.cluster.closed_loop import ClosedLoop, run_closed_trace
from sim.engine.core import BatchPlan, Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import RunResult, run_trace


def measured_run(requests: list[Request], config: SchedulerConfig, model: Transformer,
                 seed: int = 0,
                 on_step: Callable[[float, list[Request]], None] | None = None,
                 step_log: list[tuple[BatchPlan, float]] | None = None,
                 on_backend: Callable[[ModelBackend], None] | None = None,
                 loop: ClosedLoop | None = None,
                 on_scheduler: Callable[[Scheduler], None] | None = None) -> RunResult:
    """Replay requests on the model; the clock advances by each step's measured duration.
    step_log, if given, receives every step's (plan, seconds); on_backend, the run's
    backend before its first step; with a loop, requests arrive as it releases them
    (sim.cluster.closed_loop), not at their times; on_scheduler, the run's scheduler (its
    counters, such as speculation's, once the run returns)."""
    attach_prompt_tokens(requests, model.args.vocab_size, seed)
    scheduler = Scheduler(config)
    if on_scheduler is not None:
        on_scheduler(scheduler)
    backend = ModelBackend(model, scheduler.block_manager, step_log=step_log,
                           drafter=build_drafter(config.speculative, model,
                                                 scheduler.block_manager, seed))
    if on_backend is not None:
        on_backend(backend)
    if loop is not None:
        return run_closed_trace(requests, Engine(scheduler, backend), loop, on_step)
    return run_trace(requests, Engine(scheduler, backend), on_step=on_step)
