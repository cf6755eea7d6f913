"""`servelab serve --simulate` against `servelab simulate`: the same trace, side by side.

Starts the simulated server as a subprocess (the deployment flags below), replays the trace
at it with `servelab bench-serve` (another subprocess, so the client does not share the
server's interpreter), runs `servelab simulate` with the same flags, and prints the median
TTFT and ITL of both and their ratio, with how long the server took to start listening.
The server's wall clock adds what the simulator leaves out: Python bookkeeping between
steps (servelab/serve/simulated.py takes it out of each step's sleep), HTTP and SSE latency. The
server's request log gives its own TTFT (request parsed -> first token's step end), so the
client's TTFT less that is the HTTP path.
Run: python benchmarks/fidelity/serve_simulated.py [--max-requests 500] [--qps-scale 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from executor.loading import cpu_model
from sim.engine.scheduler_config import DEFAULT_POLICY

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("completed", "failed", "request_throughput", "median_ttft_ms", "p99_ttft_ms",
        "median_itl_ms", "p99_itl_ms", "median_tpot_ms", "median_e2el_ms")
RATIO_KEYS = ("median_ttft_ms", "median_itl_ms", "median_tpot_ms", "median_e2el_ms")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="azure-conv")
    parser.add_argument("--max-requests", type=int, default=500)
    parser.add_argument("--qps-scale", type=float, default=1.0, help="arrival rate x this")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="passed to both sides")
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--hardware", default="h100")
    return parser.parse_args()



def servelab(*argv: str) -> None:
    """`python -m servelab ARGV` in this interpreter, its table on our stdout; raises on failure."""
    subprocess.run([sys.executable, "-m", "servelab", *argv], cwd=ROOT, check=True)


def start_server(deployment: list[str], out: Path) -> tuple[subprocess.Popen, str, float]:
    """The simulated server on a free port: the process, its URL, seconds until listening."""
    start = time.perf_counter()
    log = out / "server.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "servelab", "serve", "--simulate", *deployment,
             "--port", "0", "--request-log", str(out / "requests.sqlite")],
            cwd=ROOT, stderr=stderr)
    while True:  # the listening line is its first line on stderr
        match = re.search(r"servelab serve: .* listening on (http://\S+)", log.read_text())
        if match is not None:
            break
        if process.poll() is not None or time.perf_counter() - start > 60:
            process.kill()
            raise RuntimeError(f"servelab serve --simulate did not start: {log.read_text()}")
        time.sleep(0.05)
    started_s = time.perf_counter() - start
    print(match.group(0), flush=True)
    return process, match.group(1), started_s


def main() -> None:
    args = parse_args()
    deployment = ["--model", args.model, "--hardware", args.hardware, "--policy", args.policy]
    trace = ["--trace", args.trace, "--max-requests", str(args.max_requests),
             "--qps-scale", str(args.qps_scale)]
    out = Path(tempfile.mkdtemp(prefix="serve_simulated_"))
    print(f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores; {args.trace} "
          f"x{args.max_requests} at qps-scale {args.qps_scale}; {args.model} on "
          f"{args.hardware}, {args.policy}", flush=True)
    process, url, started_s = start_server(deployment, out)
    try:
        servelab("bench-serve", "--url", url, *trace, "--json", str(out / "serve.json"))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    servelab("simulate", *deployment, *trace, "--json", str(out / "simulate.json"))
    served = json.loads((out / "serve.json").read_text())["results"]["server"]
    simulated = json.loads((out / "simulate.json").read_text())["results"][args.policy]
    print(f"\nserver listening {started_s:.1f} s after launch; results in {out}")
    server_ttft_ms = logged_median_ttft_ms(out / "requests.sqlite")
    print(f"median TTFT in the server's own log: {server_ttft_ms:.2f} ms (client's: "
          f"{served['median_ttft_ms']:.2f} ms; simulate's: {simulated['median_ttft_ms']:.2f} ms)")
    print(f"{'metric':<22}{'simulate':>12}{'serve':>12}{'serve/sim':>12}")
    for key in KEYS:
        sim, srv = simulated.get(key), served.get(key)
        ratio = f"{srv / sim:.3f}" if key in RATIO_KEYS and sim else ""
        print(f"{key:<22}{_cell(sim):>12}{_cell(srv):>12}{ratio:>12}")


def logged_median_ttft_ms(path: Path) -> float:
    """Median TTFT of the requests the server's log has as finished by length."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT ttft_s FROM requests WHERE finish_reason = 'length'")
        return 1000 * statistics.median(row[0] for row in rows)


def _cell(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:d}" if isinstance(value, int) else f"{value:.2f}"


if __name__ == "__main__":
    main()
