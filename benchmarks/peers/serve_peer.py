"""The HTTP server vs the offline engine on the peer workload: output tokens per wall second.

The peer model (peer-45m preset, random weights from seed 0, fp32) gets 32 requests that all
arrive at t=0, greedy with EOS ignored. Offline: Scheduler + ModelBackend in a plain loop in
this process. Served: `servelab serve` in a subprocess, driven by the bench-serve client
(streaming, token-id prompts) from this process. Both run `--repeats` times, alternating;
the best of each is compared and the served outputs are checked against the offline ones.
Each run prints the cores it used and those others used meanwhile: on a shared machine a
run that overlapped someone else's work is not comparable.
Run: python benchmarks/peers/serve_peer.py [--threads N] [--repeats R] [--policy P]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from peer_workload import peer_workload  # noqa: E402

from executor.loading import configure_cpu_threads  # noqa: E402 (before torch is imported)
from sim.engine.scheduler_config import DEFAULT_POLICY  # noqa: E402

CPUS = os.sched_getaffinity(0)  # before torch binds this thread to one core

MODEL, NUM_BLOCKS, MAX_MODEL_LEN = "peer-45m", 2048, 2048


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side (best counts)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="continuous|recompute|chunked")
    return parser.parse_args()


def offline(model, prompts: list[list[int]], outputs: list[int], policy: str):
    """(output tokens per wall second, outputs) of a plain engine loop, all requests at t=0."""
    from executor.backend import ModelBackend
    from sim.engine.core import Request, SamplingParams
    from sim.engine.scheduler import Scheduler
    from sim.engine.scheduler_config import SchedulerConfig
    from sim.engine.step import Engine

    config = SchedulerConfig(policy=policy, num_blocks=NUM_BLOCKS, max_model_len=MAX_MODEL_LEN)
    scheduler = Scheduler(config)
    engine = Engine(scheduler, ModelBackend(model, scheduler.block_manager))
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    requests = [Request(str(i), 0.0, len(p), n, list(p), params)
                for i, (p, n) in enumerate(zip(prompts, outputs, strict=True))]
    start = time.perf_counter()
    for request in requests:
        engine.add(request)
    while scheduler.has_unfinished:
        plan = engine.schedule(time.perf_counter() - start)
        result = engine.execute(plan)
        engine.finish_step(plan, result, time.perf_counter() - start - result.duration_s)
    wall_s = time.perf_counter() - start
    return sum(outputs) / wall_s, [r.output_token_ids for r in requests]


class Server:
    """`servelab serve` with the peer model in a subprocess."""

    def __init__(self, threads: int | None, policy: str) -> None:
        cmd = [sys.executable, "-m", "servelab", "serve", "--model", MODEL, "--port", "0",
               "--num-blocks", str(NUM_BLOCKS), "--max-model-len", str(MAX_MODEL_LEN),
               "--policy", policy]
        if threads is not None:
            cmd += ["--threads", str(threads)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        self.url, ready = "", threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                if "listening on " in line and not self.url:
                    self.url = line.rsplit("listening on ", 1)[1].strip()
                    ready.set()
                print(f"  [server] {line.rstrip()}", file=sys.stderr)

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(120):
            self.proc.kill()
            raise RuntimeError("the server did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def served(url: str, prompts: list[list[int]], outputs: list[int]):
    """(output tokens per wall second, outputs) of one bench-serve run, all requests at t=0.

    The client runs on its own thread, free to use any core: this process's main thread was
    pinned to one core with torch's threads, like a server's engine thread.
    """
    from servelab.bench.client import BenchConfig, BenchRequest, run_bench, summarize_bench

    requests = [BenchRequest(str(i), 0.0, p, n) for i, (p, n) in
                enumerate(zip(prompts, outputs, strict=True))]
    box = []

    def client() -> None:
        os.sched_setaffinity(0, CPUS)
        box.append(asyncio.run(run_bench(requests, BenchConfig(url, timeout_s=600))))

    thread = threading.Thread(target=client)
    thread.start()
    thread.join()
    result = box[0]
    summary = summarize_bench(result)
    if summary["completed"] != len(requests):
        raise RuntimeError(f"served run lost requests: {result.errors[:3]}")
    return summary["output_throughput"], [r.output_token_ids for r in result.requests]


class LoadMeter:
    """Cores busy during a run: ours (this process and the server) and everyone else's.

    The machine is shared; a run that overlapped someone else's work is not comparable.
    Linux only (/proc); elsewhere the columns read 'n/a'.
    """

    def __init__(self, server_pid: int) -> None:
        self.pids = (os.getpid(), server_pid)
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _sample(self) -> tuple[float, float, float] | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
            ours = 0
            for pid in self.pids:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ours += int(stat[11]) + int(stat[12])  # utime + stime of all threads
        except (OSError, ValueError, IndexError):
            return None
        busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
        return busy / self.tick, ours / self.tick, time.perf_counter()

    def measure(self, fn):
        """fn()'s result and a note: '(ours X cores, others Y)'."""
        before = self._sample()
        result = fn()
        after = self._sample()
        if before is None or after is None:
            return result, "(load n/a)"
        wall = after[2] - before[2]
        ours, busy = (after[1] - before[1]) / wall, (after[0] - before[0]) / wall
        return result, f"(ours {ours:.2f} cores, others {max(0.0, busy - ours):.2f})"


def main() -> None:
    args = parse_args()
    # Start the server first: a child inherits the CPU affinity of the thread that spawns
    # it, and pinning torch's threads below binds this one to a single core.
    server = Server(args.threads, args.policy)
    try:
        rates = compare(server, args)
    finally:
        server.close()
    best_offline, best_served = max(rates["offline"]), max(rates["served"])
    print(f"offline engine (best of {args.repeats})   {best_offline:8.1f} output tok/s")
    print(f"served over HTTP (best of {args.repeats}) {best_served:8.1f} output tok/s")
    print(f"ratio served / offline             {best_served / best_offline:8.1%}")


def compare(server: Server, args: argparse.Namespace) -> dict[str, list[float]]:
    """Alternate offline and served runs; their output tokens per second."""
    threads = configure_cpu_threads(args.threads)
    import torch

    from executor.backend import load_model

    prompts, outputs = peer_workload(0)
    print(f"peer workload: 32 requests, {sum(len(p) for p in prompts)} prompt and "
          f"{sum(outputs)} output tokens; {MODEL} fp32, {threads} threads, "
          f"torch {torch.__version__}, policy {args.policy}")
    model = load_model(MODEL, "cpu", torch.float32, seed=0)
    offline(model, prompts[:4], [4] * 4, args.policy)  # warm up kernels and allocator
    served(server.url, prompts[:4], [4] * 4)  # warm up the server the same way
    meter = LoadMeter(server.proc.pid)
    rates: dict[str, list[float]] = {"offline": [], "served": []}
    for repeat in range(args.repeats):
        (rate, reference), load = meter.measure(
            lambda: offline(model, prompts, outputs, args.policy))
        rates["offline"].append(rate)
        print(f"repeat {repeat}: offline {rate:7.1f} tok/s {load}")
        (rate, got), load = meter.measure(lambda: served(server.url, prompts, outputs))
        rates["served"].append(rate)
        same = sum(a == b for a, b in zip(got, reference, strict=True))
        print(f"          served  {rate:7.1f} tok/s {load}; outputs identical: {same}/32")
    return rates


if __name__ == "__main__":
    main()
