"""A trace's prefix hash ids mean the same on the executor as in the simulator: the executor's
synthetic prompts share tokens where the ids match, and its token-keyed prefix cache finds
exactly the prefixes the simulator's id-keyed cache finds."""

from __future__ import annotations

from executor.backend import ModelBackend
from executor.prompts import attach_prompt_tokens
from sim.cost.fixed_backend import ConstantBackend
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace
from sim.replay.workload import requests_from_trace
from tests.executor.helpers import FixedClock
from workloads.trace import PREFIX_BLOCK_TOKENS, Trace


def trace() -> Trace:
    """Requests 1 s apart (each finishes before the next arrives), three prefix families,
    some prompts past their hash block's end, some shorter than a block."""
    ids = [[1], [1], [2], [1, 3], [2], [1, 3], [4], [1, 3, 5]]
    lengths = [90, 70, 40, 600, 60, 560, 12, 1000]
    return Trace.from_arrays("families", [float(i) for i in range(len(ids))], lengths,
                             [3] * len(ids), prefix_hash_ids=ids)


def test_executor_finds_the_prefixes_the_simulator_finds(tiny_model):
    config = SchedulerConfig("chunked", num_blocks=256, max_model_len=1024)
    simulated = requests_from_trace(trace())
    run_trace(simulated, Engine(Scheduler(config), ConstantBackend(0.01, 1e-5)))
    measured = requests_from_trace(trace())
    attach_prompt_tokens(measured, tiny_model.args.vocab_size, seed=0)  # as measured_run does
    scheduler = Scheduler(config)
    # The model's steps on the simulator's clock: each request finishes before the next
    # arrives however fast or slow the machine runs them, so both see the same cache.
    executor = FixedClock(ModelBackend(tiny_model, scheduler.block_manager), 0.01)
    run_trace(measured, Engine(scheduler, executor))
    expected = [r.num_cached_tokens for r in simulated]
    assert [r.num_cached_tokens for r in measured] == expected
    # r1's 70 tokens are r0's first 70: four full blocks (the 70th token is computed). r5
    # is r3's first 560: 34 full blocks fit in its first 559 tokens.
    assert expected[1] == 64 and expected[5] == PREFIX_BLOCK_TOKENS + 32
    assert expected[0] == expected[6] == 0
