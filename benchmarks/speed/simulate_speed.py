"""How fast the simulator replays a trace, side by side with the reference figure.

Runs `servelab compare --trace azure-code` with all four policies (the issue's target:
under 10 s wall on a 2-core machine, against 41 s that the best existing simulator took for
ONE policy on the same trace), then checks that scheduler work per step does not grow
with the number of requests seen: microseconds per step on growing prefixes of the trace.

    python benchmarks/speed/simulate_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from sim.cost.roofline import AnalyticCostModel
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace
from sim.replay.workload import requests_from_trace
from sim.specs.engine_limits import ENGINE_DEFAULTS
from workloads import load_bundled
from workloads.transforms import head

REFERENCE_ONE_POLICY_S = 41.0  # best existing simulator, one policy, same trace, same machine


def compare_wall_s(repeats: int) -> list[float]:
    """Wall seconds of the whole CLI run, interpreter start and trace load included."""
    command = [sys.executable, "-m", "servelab", "compare", "--trace", "azure-code",
               "--policies", "static,continuous,recompute,chunked"]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def us_per_step(n: int, policy: str) -> tuple[float, float, int]:
    """Microseconds per step and per batch row, and the step count, for the first n."""
    trace = head(load_bundled("azure-code"), n)
    backend = AnalyticCostModel.preset()
    num_blocks = backend.kv_pool_blocks(ENGINE_DEFAULTS.block_size)
    config = SchedulerConfig(policy=policy, num_blocks=num_blocks)
    engine = Engine(Scheduler(config), backend)
    requests = requests_from_trace(trace)
    start = time.perf_counter()
    result = run_trace(requests, engine)
    elapsed = time.perf_counter() - start
    rows = sum(step.batch_size for step in result.steps)
    return elapsed / len(result.steps) * 1e6, elapsed / rows * 1e6, len(result.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    walls = compare_wall_s(args.repeats)
    median = statistics.median(walls)
    print(f"servelab compare, azure-code, 4 policies: median {median:.2f} s wall "
          f"({', '.join(f'{w:.2f}' for w in walls)})")
    print(f"  vs reference one policy {REFERENCE_ONE_POLICY_S:.0f} s: "
          f"{REFERENCE_ONE_POLICY_S / median:.1f}x faster for 4x the work "
          f"({4 * REFERENCE_ONE_POLICY_S / median:.0f}x per policy)")
    print("scheduler cost vs requests seen: per step, and per batch row (it should track the")
    print("running batch, not the requests seen)")
    for n in (1000, 4000, 8819):
        for policy in ("continuous", "chunked"):
            step_us, row_us, steps = us_per_step(n, policy)
            print(f"  first {n:>5} requests, {policy:<10}: {step_us:5.1f} us/step, "
                  f"{row_us:4.2f} us/row ({steps} steps)")


if __name__ == "__main__":
    main()
