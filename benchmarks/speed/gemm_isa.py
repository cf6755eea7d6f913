"""servelab's native GEMM per instruction set (AVX2, AVX-512) against torch's F.linear (oneDNN),
at the peer model's layer sizes, and the native paged attention per ISA at a decode batch.

Every variant of a shape is timed in turn, round after round in one process, and each gets
the median of its rounds, so a shared machine's drifting speed hits all of them alike; read
the ratios, not the absolute times. Decode shapes (rows 1, 8, 32) stream the weights once
(memory bound); prefill shapes (256, 1024 rows) are compute bound.
Run: python benchmarks/speed/gemm_isa.py [--threads N] [--rounds 7] [--rows 1,8,32,256,1024]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from executor.loading import configure_cpu_threads  # noqa: E402 (before torch is imported)

# The peer model's linears (hidden 512, intermediate 1408, vocab 32000): name, out, in.
LAYERS = [("qkv", 1024, 512), ("o", 512, 512), ("gate_up", 2816, 512), ("down", 512, 1408),
          ("vocab", 32000, 512)]
MIN_TIMED_S = 0.02  # each timing repeats a call until it lasts about this long


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median counts)")
    parser.add_argument("--rows", default="1,8,32,256,1024", help="row counts M, comma-separated")
    return parser.parse_args()


ARGS = parse_args()
THREADS = configure_cpu_threads(ARGS.threads)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from executor import native  # noqa: E402
from executor.loading import cpu_model  # noqa: E402


def use_isa(name: str):
    """The kernels on one ISA from here on (what SERVELAB_ISA does at start-up)."""
    os.environ[native.ISA_ENV] = name
    return native.kernels()


def median_times_s(calls: dict[str, object], rounds: int) -> dict[str, float]:
    """Seconds per call of each callable: the median of `rounds` interleaved timings."""
    repeats = {}
    for name, call in calls.items():  # warm up, and size each timing to MIN_TIMED_S
        call()
        start = time.perf_counter()
        call()
        repeats[name] = max(1, round(MIN_TIMED_S / max(time.perf_counter() - start, 1e-7)))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(repeats[name]):
                call()
            times[name].append((time.perf_counter() - start) / repeats[name])
    return {name: statistics.median(values) for name, values in times.items()}


def linear_calls(isas: list[str], rows: int, out_features: int, in_features: int) -> dict:
    """One call per variant on the same random input; checks they agree first."""
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, in_features, generator=generator)
    x = torch.randn(rows, in_features, generator=generator)
    calls = {}
    for name in isas:
        panels = use_isa(name).pack_weight(weight)  # packed for that ISA, run with it
        calls[name] = lambda p=panels: torch.ops.servelab.linear(x, p, None, out_features)
    calls["torch"] = lambda: F.linear(x, weight)
    expected = calls["torch"]()
    for name in isas:
        torch.testing.assert_close(calls[name](), expected, rtol=1e-4, atol=1e-3)
    return calls


def gemm_table(isas: list[str], row_counts: list[int], rounds: int) -> None:
    base = isas[-1]  # the fastest ISA; ratios are other times / its time (> 1: it is faster)
    print(f"\nGEMM y = x W^T, float32: ms per call, GFLOP/s, and time ratios to {base}")
    header = f"{'layer':>8} {'M':>5} {'N':>6} {'K':>5} |" + "".join(
        f" {name + ' ms':>10} {'GF/s':>6} |" for name in isas + ["torch"])
    print(header + " " + " ".join(f"{name}/{base}" for name in isas[:-1] + ["torch"]))
    with torch.inference_mode():
        for rows in row_counts:
            for layer, out_features, in_features in LAYERS:
                calls = linear_calls(isas, rows, out_features, in_features)
                times = median_times_s(calls, rounds)
                flops = 2 * rows * out_features * in_features
                cells = "".join(f" {times[n] * 1e3:>10.3f} {flops / times[n] / 1e9:>6.1f} |"
                                for n in calls)
                ratios = " ".join(f"{times[n] / times[base]:.2f}" for n in calls if n != base)
                print(f"{layer:>8} {rows:>5} {out_features:>6} {in_features:>5} |{cells} {ratios}")


def attention_table(isas: list[str], rounds: int, seqs: int = 32, context: int = 512) -> None:
    """Decode: `seqs` rows, each at position `context` of its own sequence (peer shapes)."""
    heads, kv_heads, dim, block_size = 8, 4, 64, 16
    generator = torch.Generator().manual_seed(0)
    width = context // block_size + 1
    cache = torch.randn(2 * kv_heads, seqs * width, block_size, dim, generator=generator)
    tables = torch.randperm(seqs * width, generator=generator).view(seqs, width)
    q = torch.randn(seqs, heads + kv_heads, dim, generator=generator)[:, :heads]
    row_seq, positions = torch.arange(seqs), torch.full((seqs,), context)

    def attend(name: str):
        use_isa(name)
        return torch.ops.servelab.paged_attention(q, cache, tables, row_seq, positions, seqs,
                                                  dim ** -0.5, 0)

    times = median_times_s({name: lambda n=name: attend(n) for name in isas}, rounds)
    cells = ", ".join(f"{name} {times[name] * 1e3:.3f} ms" for name in isas)
    print(f"\nPaged attention, decode of {seqs} rows at {context} keys, {heads} heads "
          f"({kv_heads} KV) x {dim}: {cells}; {isas[0]} / {isas[-1]} = "
          f"{times[isas[0]] / times[isas[-1]]:.2f}")


def main() -> None:
    ops = native.kernels()
    if ops is None:
        raise SystemExit("servelab's native kernels did not build here (executor/native.py)")
    isas = list(ops.cpu_isas())
    print(f"{cpu_model()}; {THREADS} thread(s); torch {torch.__version__} "
          f"(CPU capability {torch.backends.cpu.get_cpu_capability()}); native ISAs: "
          f"{', '.join(isas)}; median of {ARGS.rounds} interleaved rounds")
    gemm_table(isas, [int(m) for m in ARGS.rows.split(",")], ARGS.rounds)
    attention_table(isas, ARGS.rounds)


if __name__ == "__main__":
    main()
