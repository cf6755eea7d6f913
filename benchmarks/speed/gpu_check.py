"""The executor on a CUDA GPU in one run of a few minutes: what its CUDA path does and how fast.

1. decode throughput of a model shape (default qwen2.5-0.5b, random weights, bf16 on CUDA) at
   1, 2, 4, ..., 256 rows of 512 tokens of context: step time (median of the timed rounds,
   the calibration profile's method) and tokens per second;
2. the peer workload (32 requests at t=0, peer-45m) through the continuous policy: wall time,
   tokens per second, and whether every request got all its tokens;
3. the GPU tests (pytest -m gpu tests/executor/test_gpu.py);
4. `servelab calibrate` on the device, the fit written to OUT;
5. `servelab run` of a bundled trace on the device, its JSON written to OUT.
Writes OUT/gpu_check.json and prints a summary; a step that fails is recorded and the rest
still run. `--device cpu --model tiny --quick` checks the script itself in a minute or two.
Run: python benchmarks/speed/gpu_check.py [--out reports/gpu] [--model qwen2.5-0.5b] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))  # the peer workload and runs

from sim.specs.engine_limits import ENGINE_DEFAULTS  # noqa: E402

BLOCK_SIZE = ENGINE_DEFAULTS.block_size
CONTEXT = 512


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "gpu")
    parser.add_argument("--model", default="qwen2.5-0.5b", help="preset or checkpoint dir")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto", help="auto: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per batch size")
    parser.add_argument("--quick", action="store_true", help="batches up to 16, small runs")
    return parser.parse_args()


def decode_throughput(loaded, batches: list[int], repeats: int) -> list[dict]:
    """Step time and tokens/s of a decode step of each batch size over CONTEXT tokens."""
    import numpy as np

    from executor.backend import ModelBackend
    from executor.profile import ProfilePoint, measure
    from sim.engine.block_manager import BlockManager

    blocks = max(batches) * -(-(CONTEXT + 1) // BLOCK_SIZE) + 1
    backend = ModelBackend(loaded.model, BlockManager(blocks, BLOCK_SIZE))
    points = [ProfilePoint("decode", ((CONTEXT, 1),) * b) for b in batches]
    _, times = measure(backend, points, repeats)
    steps = np.median(times, axis=0)
    return [{"batch": b, "step_ms": round(float(t) * 1e3, 4), "tok_s": round(b / float(t), 1)}
            for b, t in zip(batches, steps, strict=True)]


def peer_run(device: str, dtype: str) -> dict:
    """The peer workload through the continuous policy on the device."""
    from executor_runs import ours_continuous
    from peer_workload import peer_workload

    from executor.loading import load

    prompts, outputs = peer_workload()
    model = load("peer-45m", device, dtype).model
    ours_continuous(model, prompts[:4], [4] * 4)  # warm-up
    tokens, wall, peak = ours_continuous(model, prompts, outputs)
    complete = sum(len(tokens[f"r{i}"]) == n for i, n in enumerate(outputs))
    return {"wall_s": round(wall, 3), "tok_s": round(sum(outputs) / wall, 1),
            "peak_batch": peak, "complete": f"{complete}/{len(outputs)}"}


def command(name: str, argv: list[str], timeout_s: int) -> dict:
    """Run a step as its own process: exit code, seconds, the end of its output."""
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, text = "timeout", f"{exc}"
    seconds = time.perf_counter() - start
    print(f"{name}: exit {code} in {seconds:.0f} s")
    return {"exit": code, "seconds": round(seconds, 1), "tail": text[-3000:]}


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    from executor.loading import cpu_model, load

    loaded = load(args.model, args.device, args.dtype)
    hardware = (torch.cuda.get_device_name(loaded.device) if loaded.device.type == "cuda"
                else cpu_model())
    result: dict = {"hardware": hardware, "torch": torch.__version__, "model": args.model,
                    "dtype": str(loaded.dtype).removeprefix("torch."), "context": CONTEXT}
    print(f"{hardware}; torch {torch.__version__}; {args.model} in {result['dtype']}")
    batches = [2**i for i in range(5 if args.quick else 9)]
    try:
        result["decode"] = decode_throughput(loaded, batches, args.repeats)
        for row in result["decode"]:
            print(f"decode batch {row['batch']:4d}: {row['step_ms']:8.3f} ms/step "
                  f"{row['tok_s']:10.1f} tok/s")
    except (RuntimeError, ValueError) as exc:  # out of memory, a kernel error: record it
        result["decode"] = f"failed: {exc}"
    try:
        result["peer"] = peer_run(args.device, args.dtype)
        print(f"peer workload: {result['peer']}")
    except (RuntimeError, ValueError) as exc:
        result["peer"] = f"failed: {exc}"
    del loaded
    device = ["--device", args.device, "--dtype", args.dtype, "--model", args.model]
    python = [sys.executable, "-m"]
    result["gpu_tests"] = command("GPU tests", python + [
        "pytest", "-m", "gpu", "-p", "no:cacheprovider", "tests/executor/test_gpu.py"], 150)
    calibration = args.out / f"calibration-{Path(args.model).name}-{args.device}.json"
    result["calibrate"] = command("servelab calibrate", python + [
        "servelab", "calibrate", *device, "--out", str(calibration), "--repeats", "5",
        *(["--quick"] if args.quick else [])], 240)
    requests = ["--max-requests", "20", "--length-scale", "0.1"] if args.quick else [
        "--max-requests", "300"]
    result["run"] = command("servelab run", python + [
        "servelab", "run", *device, "--trace", "azure-conv", *requests,
        "--json", str(args.out / "run.json")], 180)
    path = args.out / "gpu_check.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
