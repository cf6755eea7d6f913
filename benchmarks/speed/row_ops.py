"""The native row ops between a layer's GEMMs against the same steps as torch ops, in one process.

Serves the peer workload (32 requests at t=0, greedy) through our engine with the peer-45m model
(random weights) on the native kernels, alternating run by run between the row ops native
(RMSNorm with its residual add, SiLU-and-multiply, RoPE with the KV write) and the same steps as
torch ops; the GEMMs and the paged attention stay native in both. Prints each side's median wall
time, their spread, and the ratio of the medians; checks the outputs agree.
Run: python benchmarks/speed/row_ops.py [--repeats 8] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))  # the peer workload

from executor.loading import configure_cpu_threads  # noqa: E402 (before torch is imported)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8, help="runs per side")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    threads = configure_cpu_threads(args.threads)
    import torch
    from executor_runs import ours_continuous
    from peer_workload import peer_workload

    from executor.backend import load_model
    from executor.loading import cpu_model

    model = load_model("peer-45m")
    if not model.native:
        sys.exit("servelab's native kernels are not available here: nothing to compare")
    prompts, outputs = peer_workload()
    print(f"{cpu_model()}; {threads} thread(s); torch {torch.__version__}; "
          f"ISA {torch.ops.servelab.isa()}; {sum(outputs)} output tokens per run")
    ours_continuous(model, prompts[:4], [4] * 4)  # warm-up
    walls: dict[bool, list[float]] = {True: [], False: []}
    tokens: dict[bool, dict[str, list[int]]] = {}
    for i in range(2 * args.repeats):  # alternate, so drifting load hits both sides alike
        native_rows = i % 2 == 0
        model.use_row_ops(native_rows)
        tokens[native_rows], wall, _ = ours_continuous(model, prompts, outputs)
        walls[native_rows].append(wall)
    model.use_row_ops(True)
    for native_rows, name in ((True, "row ops native"), (False, "row ops in torch")):
        times = walls[native_rows]
        print(f"{name:<17} median {statistics.median(times):.3f} s  "
              f"({min(times):.3f}-{max(times):.3f} s, {len(times)} runs)")
    ratio = statistics.median(walls[False]) / statistics.median(walls[True])
    print(f"ratio torch / native (medians): {ratio:.2f}x")
    same = sum(tokens[True][r] == tokens[False][r] for r in tokens[True])
    print(f"greedy outputs identical: {same}/{len(tokens[True])}")


if __name__ == "__main__":
    main()
