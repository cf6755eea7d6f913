"""Executor vs Hugging Face on the peer workload: tokens per wall second, side by side.

The peer model (random LlamaForCausalLM, 44.6M parameters, fp32) serves 32 requests that all
arrive at t=0, greedy with EOS ignored, through HF sequential generate, HF static batching,
HF continuous batching (if this transformers has it), vLLM's CPU build (offline LLM.generate in
its own venv, see vllm_offline.py; start-up excluded) and servelab's continuous policy, with
its native CPU kernels and on the torch path (SERVELAB_NATIVE=0) in the same run, against a
rough ceiling for the machine (ceiling()). Then the classic comparison: N requests one at a
time vs continuous batching in our engine. On a shared machine timings swing with other
tenants' load, so each run is repeated, rounds interleave the systems, and the best and median
wall times are printed (HF sequential, the slowest, runs once).
Run: python benchmarks/peers/executor_peer.py [--threads N] [--repeats 3] [--skip-sequential]
     [--vllm | --no-vllm] [--vllm-venv PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_server import VllmConfig  # noqa: E402

from executor.loading import configure_cpu_threads  # noqa: E402 (before torch is imported)

CORES = sorted(os.sched_getaffinity(0))  # before torch's OpenMP binds this thread to one core
VLLM = "vLLM (CPU, offline)"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    parser.add_argument("--skip-sequential", action="store_true", help="skip HF one-at-a-time")
    parser.add_argument("--skip-hf", action="store_true", help="run only our engine")
    parser.add_argument("--repeats", type=int, default=3, help="runs per system (best counts)")
    parser.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=None,
                        help="vLLM as a peer (default: if its venv exists; --vllm installs it)")
    parser.add_argument("--vllm-venv", type=Path, default=VllmConfig.venv)
    return parser.parse_args()


ARGS = parse_args()
configure_cpu_threads(ARGS.threads)

import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from executor_runs import (  # noqa: E402
    hf_continuous,
    hf_sequential,
    hf_static,
    ours_continuous,
    ours_one_at_a_time,
)
from peer_workload import VOCAB, peer_workload  # noqa: E402
from vllm_offline import OfflinePeer, start_offline_peer  # noqa: E402

from executor import native  # noqa: E402
from executor.weights import load_hf_model  # noqa: E402


def peer_hf_model():
    """The random peer LlamaForCausalLM, seeded with torch.manual_seed(0)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def report(name: str, tokens: int, walls: list[float]) -> tuple[float, float]:
    """Print and return (best, median) output tokens per wall second over the runs."""
    best, median = min(walls), statistics.median(walls)
    print(f"{name:<26} {tokens:5d} tok  best {best:6.2f} s {tokens / best:7.1f} tok/s  "
          f"median {median:6.2f} s {tokens / median:7.1f} tok/s  ({len(walls)} runs)")
    return tokens / best, tokens / median


def systems(model, torch_path_model, hf_model) -> dict:
    """name -> run(prompts, outputs) returning (outputs by id, wall_s, ...)."""
    runs = {"servelab continuous": lambda p, o: ours_continuous(model, p, o)}
    if model.native:  # the same engine without the native kernels (oneDNN, batched matmuls)
        runs["servelab, torch path"] = lambda p, o: ours_continuous(torch_path_model, p, o)
    if ARGS.skip_hf:
        return runs
    runs["HF static batch"] = lambda p, o: hf_static(hf_model, p, o)
    if hf_continuous(hf_model, [[5, 6, 7]], [2]) is None:
        print("HF continuous batching: not available in this transformers, skipped")
    else:
        runs["HF continuous batching"] = lambda p, o: hf_continuous(hf_model, p, o)
    return runs


def compare(ours: dict[str, list[int]], ref: dict[str, list[int]], label: str) -> None:
    bad = [rid for rid in ref if ours[rid] != ref[rid]]
    print(f"greedy outputs vs {label}: {len(ref) - len(bad)}/{len(ref)} identical")
    for rid in bad:
        first = next(i for i, (a, b) in enumerate(zip(ours[rid], ref[rid], strict=False)) if a != b)
        print(f"  {rid}: first difference at output token {first}")


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.2f}")
    prompts, outputs = peer_workload()
    total = sum(outputs)
    print(f"peer workload: 32 requests, {sum(map(len, prompts))} prompt tokens, {total} output")
    hf_model = peer_hf_model()
    print(f"model: {sum(p.numel() for p in hf_model.parameters()) / 1e6:.1f}M parameters, fp32")
    limit = measured_ceiling(hf_model, prompts, outputs)
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        model = load_hf_model(tmp)
        with native.disabled():
            torch_path_model = load_hf_model(tmp)
    print(f"servelab kernels: {'native' if model.native else 'torch path (native not built)'}")
    for m in (model, torch_path_model):
        ours_continuous(m, prompts[:4], [4] * 4)  # warm-up: first oneDNN calls are slow
    runs = systems(model, torch_path_model, hf_model)
    with contextlib.ExitStack() as stack:
        peer = vllm_peer(stack, prompts, outputs)
        if peer is not None:  # its workload went to it at start-up
            runs[VLLM] = lambda p, o: peer.generate()
        walls, tokens = timed_rounds(runs, prompts, outputs)
    if not (ARGS.skip_hf or ARGS.skip_sequential):
        tokens["HF sequential generate"], wall = hf_sequential(hf_model, prompts, outputs)
        walls["HF sequential generate"] = [wall]
    rates = {name: report(name, total, times) for name, times in walls.items()}
    ours = "servelab continuous"
    print(f"peak in-flight batch (ours): {ours_continuous(model, prompts, outputs)[2]}")
    for name, (best, median) in rates.items():
        if name != ours:
            print(f"ratio servelab / {name}: best {rates[ours][0] / best:.2f}x, "
                  f"median {rates[ours][1] / median:.2f}x")
    print("fraction of the ceiling (best runs): " + ", ".join(
        f"{name} {best / limit.tok_s:.0%}" for name, (best, _) in rates.items()))
    for name, ref in tokens.items():
        if name != ours:
            compare(tokens[ours], ref, name)
    classic(model)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def timed_rounds(runs: dict, prompts: list[list[int]], outputs: list[int],
                 ) -> tuple[dict[str, list[float]], dict[str, dict[str, list[int]]]]:
    """ARGS.repeats rounds of every run: wall seconds per system, last outputs per system."""
    walls: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, dict[str, list[int]]] = {}
    for _ in range(ARGS.repeats):  # rounds interleave the systems so load hits them alike
        for name, run in runs.items():
            tokens[name], wall = run(prompts, outputs)[:2]
            walls[name].append(wall)
    return walls, tokens


def vllm_peer(stack: contextlib.ExitStack, prompts: list[list[int]],
              outputs: list[int]) -> OfflinePeer | None:
    """vLLM's offline engine, warmed up and closed with `stack`; None if off or it fails."""
    venv = ARGS.vllm_venv.resolve()
    if not (ARGS.vllm or (ARGS.vllm is None and (venv / "bin" / "python").exists())):
        print(f"vLLM: skipped (no venv at {venv}, or --no-vllm; --vllm installs it)")
        return None
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
    cores = CORES[:torch.get_num_threads()]
    try:
        peer = stack.enter_context(start_offline_peer(
            venv, VllmConfig.model_dir, prompts, outputs, cores, workdir))
    except (RuntimeError, TimeoutError, OSError, subprocess.CalledProcessError) as exc:
        print(f"vLLM: failed, left out: {exc}")
        return None
    print(f"vLLM {peer.info['vllm']} on cores {cores}: up in {peer.info['startup_s']:.0f} s, "
          f"warm-up generate {peer.info['warmup_s']:.1f} s (neither timed); log {peer.log_path}")
    return peer


@dataclass(frozen=True)
class Ceiling:
    """A rough upper bound on output tokens per second, and the measurements behind it."""

    bandwidth_gb_s: float
    gflop_s: float
    t_mem_s: float
    t_compute_s: float
    tok_s: float


def ceiling(prompt_tokens: int, outputs: list[int], layer_params: int, head_params: int,
            bytes_per_param: int, bandwidth_gb_s: float, gflop_s: float) -> Ceiling:
    """ceiling tok/s = total output tokens / (t_mem + t_compute), the issue's rough bound.

    t_mem: the longest request's decode steps each stream the weights once (the memory-bound
    part; the other requests' rows ride along), max(outputs) x weight bytes / bandwidth.
    t_compute: the rest at peak matmul speed, 2 flops per weight per token, / gflop_s.
    Weights count what the matmuls read: layer_params (all but the embedding and LM head
    tables) run for every prompt and output token, head_params (the LM head) once per output
    token, since a prefill needs logits at its last position only; the embedding lookup reads
    one row per token and is left out of both.
    """
    weight_bytes = (layer_params + head_params) * bytes_per_param
    t_mem_s = max(outputs) * weight_bytes / (bandwidth_gb_s * 1e9)
    flops = 2 * (layer_params * (prompt_tokens + sum(outputs)) + head_params * sum(outputs))
    t_compute_s = flops / (gflop_s * 1e9)
    return Ceiling(bandwidth_gb_s, gflop_s, t_mem_s, t_compute_s,
                   sum(outputs) / (t_mem_s + t_compute_s))


def measure_bandwidth_gb_s(nbytes: int, tries: int = 5) -> float:
    """Read bandwidth of this process's threads as a decode step sees it: sums over an fp32
    tensor of nbytes (the weights' size: whatever share of them the caches hold counts),
    best of tries."""
    src = torch.ones(nbytes // 4)
    src.sum()  # first touch faults the pages in
    return src.nbytes / min(_timed(src.sum) for _ in range(tries)) / 1e9


def measure_gflop_s(size: int = 2048, tries: int = 4) -> float:
    """Peak fp32 matmul speed of this process's threads: torch.mm on size x size matrices."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=gen), torch.randn(size, size, generator=gen)
    torch.mm(a, b)  # warm-up
    return 2 * size**3 / min(_timed(lambda: torch.mm(a, b)) for _ in range(tries)) / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measured_ceiling(hf_model, prompts: list[list[int]], outputs: list[int]) -> Ceiling:
    """Measure bandwidth and matmul speed here, then print the peer workload's ceiling."""
    head = hf_model.lm_head.weight.numel()
    tables = head + hf_model.model.embed_tokens.weight.numel()
    total = sum(p.numel() for p in hf_model.parameters())
    limit = ceiling(sum(map(len, prompts)), outputs, total - tables, head, 4,
                    measure_bandwidth_gb_s((total - tables + head) * 4), measure_gflop_s())
    print(f"ceiling: {limit.bandwidth_gb_s:.1f} GB/s read, {limit.gflop_s:.0f} GFLOP/s fp32 mm; "
          f"{limit.t_mem_s:.2f} s memory-bound + {limit.t_compute_s:.2f} s compute-bound = "
          f"{limit.tok_s:.0f} tok/s")
    return limit


def classic(model) -> None:
    """N requests x M new tokens: one at a time vs continuous batching, our engine both."""
    rng = np.random.default_rng(1)
    for count, new_tokens in ((24, 40), (64, 50)):
        lens = np.clip(np.round(rng.lognormal(np.log(64), 0.5, count)), 8, 512).astype(int)
        prompts = [rng.integers(3, VOCAB, int(n)).tolist() for n in lens]
        outputs = [new_tokens] * count
        alone, alone_s = ours_one_at_a_time(model, prompts, outputs)
        batched, batched_s, peak = ours_continuous(model, prompts, outputs)
        same = sum(alone[r] == batched[r] for r in alone)
        tokens = count * new_tokens
        print(f"classic {count} x {new_tokens}: one at a time {tokens / alone_s:7.1f} tok/s, "
              f"continuous {tokens / batched_s:7.1f} tok/s, ratio {alone_s / batched_s:.2f}x, "
              f"peak batch {peak}, identical outputs {same}/{count}")


if __name__ == "__main__":
    main()
