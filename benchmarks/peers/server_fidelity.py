"""The simulator against a real server: calibrate from its URL, then validate on workloads.

Starts vLLM's CPU server (vllm_server.py) or `servelab serve` on the peer model, runs
`servelab calibrate --url` (timed), then `servelab validate --url` on each workload with
--repeats replays (their spread is the server's own run-to-run noise), and prints per
workload the median and worst |error| over the validated metrics and the median spread.
Everything lands in --out: calibration.json, WORKLOAD.json and WORKLOAD/ (charts).
Run: python benchmarks/peers/server_fidelity.py --server vllm [--workloads conv,code,gamma]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The workloads of docs/fidelity.md, scaled to fit the peer model's 2,048 tokens.
WORKLOADS = {
    "conv": ["--trace", "azure-conv", "--max-requests", "300", "--length-scale", "0.1",
             "--qps-scale", "3"],
    "code": ["--trace", "azure-code", "--max-requests", "300", "--prompt-scale", "0.1",
             "--max-output-len", "256"],
    "gamma": ["--max-output-len", "400", "--trace",
              "synthetic:n=300,rate=8,arrival=gamma,cv=3,prompt=lognormal(120,0.8),"
              "output=pareto(12,1.5)"],
}
# vLLM's CPU defaults for its API server: max_num_seqs 128, max_num_batched_tokens 2048.
LIMITS = ["--max-num-seqs", "128", "--token-budget", "2048"]


def servelab(*argv: str) -> None:
    """`python -m servelab ARGV` in this interpreter; raises on failure."""
    subprocess.run([sys.executable, "-m", "servelab", *argv], cwd=ROOT, check=True)


@contextlib.contextmanager
def servelab_server(port: int):
    """`servelab serve` on the peer model with vLLM's CPU limits and chunked prefill."""
    log = open(ROOT / "out" / "servelab-server.log", "w")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [sys.executable, "-m", "servelab", "serve", "--model", "peer-45m", "--policy", "chunked",
         "--port", str(port), "--max-num-seqs", "128", "--token-budget", "2048",
         "--max-model-len", "2048"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("servelab serve did not come up: see out/servelab-server.log")
            time.sleep(1)
        yield url
    finally:
        process.terminate()
        process.wait(60)
        log.close()


def server(kind: str, port: int):
    if kind == "servelab":
        return servelab_server(port)
    sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
    from vllm_server import VllmConfig, start_vllm

    return start_vllm(VllmConfig(port=port, max_num_seqs=128, max_num_batched_tokens=2048))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("vllm", "servelab"), default="vllm")
    parser.add_argument("--workloads", default="conv,code,gamma")
    parser.add_argument("--repeats", type=int, default=3, help="replays per workload")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--out", type=Path, default=None,
                        help="default reports/fidelity/SERVER-server")
    args = parser.parse_args()
    # Relative to the repository (the commands run there), so no machine path is recorded.
    out = args.out or Path("reports") / "fidelity" / f"{args.server}-server"
    (ROOT / out).mkdir(parents=True, exist_ok=True)
    (ROOT / "out").mkdir(exist_ok=True)
    client = ["--model", "peer", "--vocab-size", "32000"] if args.server == "vllm" else []
    rows = []
    with server(args.server, args.port) as running:
        url = getattr(running, "url", running)
        calibration = out / "calibration.json"
        start = time.perf_counter()
        servelab("calibrate", "--url", url, "--out", str(calibration), *LIMITS, *client)
        probing_s = time.perf_counter() - start
        for name in args.workloads.split(","):
            result = out / f"{name}.json"
            servelab("validate", "--url", url, "--cost-model", str(calibration),
                     *WORKLOADS[name], "--repeats", str(args.repeats), "--out", str(out / name),
                     "--json", str(result), *client)
            overall = json.loads((ROOT / result).read_text())["overall"]
            rows.append((name, overall))
    print(f"\n{args.server} at {url}; calibration {probing_s:.0f} s; client on "
          f"{os.cpu_count()} cores")
    print(f"{'workload':<10}{'median |err|':>14}{'worst':>10}{'spread':>10}")
    for name, overall in rows:
        print(f"{name:<10}{overall['median_abs_error']:>14.1%}{overall['max_abs_error']:>10.1%}"
              f"{overall['median_spread']:>10.1%}")


if __name__ == "__main__":
    main()
