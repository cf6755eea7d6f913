"""Executor vs Hugging Face on the peer workload: tokens per wall second, side by side.

The peer model (random LlamaForCausalLM, 44.6M parameters, fp32) serves 32 requests that all
arrive at t=0, greedy with EOS ignored, through HF sequential generate, HF static batching,
HF continuous batching (if this transformers has it) and servelab's continuous policy, with
its native CPU kernels and on the torch path (SERVELAB_NATIVE=0) in the same run. Then
the classic comparison: N requests one at a time vs continuous batching in our engine.
On a shared machine timings swing with other tenants' load, so each run is repeated and the
best and median wall times are printed (HF sequential, the slowest, runs once).
Run: python benchmarks/executor_peer.py [--threads N] [--repeats 3] [--skip-sequential]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor.threads import configure_cpu_threads  # noqa: E402 (before torch is imported)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    parser.add_argument("--skip-sequential", action="store_true", help="skip HF one-at-a-time")
    parser.add_argument("--skip-hf", action="store_true", help="run only our engine")
    parser.add_argument("--repeats", type=int, default=3, help="runs per system (best counts)")
    return parser.parse_args()


ARGS = parse_args()
configure_cpu_threads(ARGS.threads)

import os  # noqa: E402
import statistics  # noqa: E402

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


def report(name: str, tokens: int, walls: list[float], rates: dict[str, float]) -> None:
    best, median = min(walls), statistics.median(walls)
    rates[name] = tokens / best
    print(f"{name:<26} {tokens:5d} tok  best {best:6.2f} s {tokens / best:7.1f} tok/s  "
          f"median {median:6.2f} s {tokens / median:7.1f} tok/s  ({len(walls)} runs)")


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
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        model = load_hf_model(tmp)
        with native.disabled():
            torch_path_model = load_hf_model(tmp)
    print(f"servelab kernels: {'native' if model.native else 'torch path (native not built)'}")
    for m in (model, torch_path_model):
        ours_continuous(m, prompts[:4], [4] * 4)  # warm-up: first oneDNN calls are slow
    runs = systems(model, torch_path_model, hf_model)
    walls: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, dict[str, list[int]]] = {}
    for _ in range(ARGS.repeats):  # rounds interleave the systems so load hits them alike
        for name, run in runs.items():
            tokens[name], wall = run(prompts, outputs)[:2]
            walls[name].append(wall)
    if not (ARGS.skip_hf or ARGS.skip_sequential):
        tokens["HF sequential generate"], wall = hf_sequential(hf_model, prompts, outputs)
        walls["HF sequential generate"] = [wall]
    rates: dict[str, float] = {}
    for name, times in walls.items():
        report(name, total, times, rates)
    ours = "servelab continuous"
    print(f"peak in-flight batch (ours): {ours_continuous(model, prompts, outputs)[2]}")
    for name, rate in rates.items():
        if name != ours:
            print(f"ratio servelab / {name} (best runs): {rates[ours] / rate:.2f}x")
    for name, ref in tokens.items():
        if name != ours:
            compare(tokens[ours], ref, name)
    classic(model)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


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
