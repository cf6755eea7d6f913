"""How long `servelab sweep` takes for 4 policies x 8 rates on the whole conv trace.

The target: 60 s with 2 workers. Prints the wall time of the pool, the sum of the
per-run times it overlapped (so the parallel efficiency), and, with --ray, the same sweep
on a local Ray instance side by side, checking that its rows are identical.

    python benchmarks/speed/sweep_speed.py [--workers 2] [--ray]
"""

from __future__ import annotations

import argparse
import time

from servelab.sweeps.grid import DEFAULT_QPS_SCALES, SweepContext, grid
from servelab.sweeps.runners import LocalRunner, RayRunner
from sim.cost.roofline import AnalyticCostModel
from sim.specs.engine_limits import ENGINE_DEFAULTS
from workloads import load_bundled

TARGET_S = 60.0
POLICIES = ("static", "continuous", "recompute", "chunked")


def timed(runner, points) -> tuple[list[dict], float]:
    with runner:
        start = time.perf_counter()
        rows = runner(points)
        return rows, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ray", action="store_true", help="also run it on local Ray")
    args = parser.parse_args()
    backend = AnalyticCostModel.preset()
    num_blocks = backend.kv_pool_blocks(ENGINE_DEFAULTS.block_size)
    context = SweepContext(load_bundled("azure-conv"), backend, num_blocks)
    points = grid(POLICIES, DEFAULT_QPS_SCALES)
    rows, wall = timed(LocalRunner(context, args.workers), points)
    print(f"{len(points)} runs of {len(context.trace):,} requests, {args.workers} workers: "
          f"{wall:.1f} s wall = {wall / TARGET_S:.2f}x the {TARGET_S:.0f} s target")
    if args.ray:
        ray_rows, ray_wall = timed(RayRunner(context, "auto", args.workers), points)
        print(f"Ray, {args.workers} tasks in flight: {ray_wall:.1f} s "
              f"({ray_wall / wall:.2f}x the pool), rows identical: {ray_rows == rows}")


if __name__ == "__main__":
    main()
