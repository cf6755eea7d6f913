"""Time loading the bundled Azure traces (median of several runs) and print the numbers."""

from __future__ import annotations

import statistics
import time

from workloads import load_bundled

RUNS = 7


def median_load_s(name: str, runs: int = RUNS) -> tuple[float, int]:
    """Median wall time to load `name` (after one warm-up load) and its request count."""
    requests = len(load_bundled(name))  # warm-up: imports, regex compilation, file cache
    times_s = []
    for _ in range(runs):
        start = time.perf_counter()
        load_bundled(name)
        times_s.append(time.perf_counter() - start)
    return statistics.median(times_s), requests


def main() -> None:
    print(f"{'trace':<12}{'requests':>10}{'median_ms':>12}{'us/request':>12}")
    for name in ("azure-conv", "azure-code"):
        seconds, requests = median_load_s(name)
        print(f"{name:<12}{requests:>10}{seconds * 1e3:>12.1f}{seconds / requests * 1e6:>12.2f}")


if __name__ == "__main__":
    main()
