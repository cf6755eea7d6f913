"""Readers of the published operator profiles the GPU cost model is fitted on.

Each returns plain records with the operator's shape per GPU (after tensor parallelism) and
its measured seconds: Vidur's per-operator CUDA times (A100, H100) and NCCL all-reduce
tables, and LLMServingSim's per-layer vLLM kernel times (RTX 4090, RTX PRO 6000).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

import sim
from sim.cost.gpu_shapes import LayerShapes, known_shapes

# The measured data's root: one folder per source, each with its licence and README.
DATA_DIR = Path(sim.__file__).parent / "data"

# Vidur's folder names -> servelab names.
VIDUR_GPUS = {"a100": "a100-80gb", "h100": "h100"}
LSS_GPUS = {"RTX4090": "rtx-4090", "RTXPRO6000": "rtx-pro-6000"}
LSS_MODELS = {"Llama-3.1-8B": "llama-3.1-8b", "Qwen3-32B": "qwen3-32b",
              "Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b"}


@dataclass(frozen=True)
class OpSample:
    """One profiled operator: kind, shape on one GPU, measured seconds."""

    gpu: str
    kind: str  # gemm, small, attn_prefill, attn_decode, sampler, moe
    tokens: int  # rows (tokens, sequences for sampler/decode)
    k: int = 0  # GEMM inner dim; for attention: query heads x head_dim on this GPU
    m: int = 0  # GEMM outer dim; for attention: KV bytes per token per layer on this GPU
    moved_bytes: float = 0.0  # small ops: bytes read + written
    context: int = 0  # attention: pairs (prefill) or KV tokens read (decode)
    experts: int = 0  # MoE: experts activated
    seconds: float = 0.0
    source: str = ""


def vidur_samples(root: Path = DATA_DIR) -> list[OpSample]:
    """GEMMs and small ops from Vidur's mlp.csv files (times in ms, medians of repeats)."""
    samples = []
    for path in sorted((root / "vidur" / "compute").glob("*/meta-llama/*/mlp.csv")):
        gpu = VIDUR_GPUS[path.parts[-4]]
        frame = pd.read_csv(path)
        for row in frame.to_dict("records"):
            samples.extend(_vidur_row(gpu, row, f"vidur {path.parts[-2]}"))
    return samples


def _vidur_row(gpu: str, row: dict, source: str) -> list[OpSample]:
    """The operators of one Vidur mlp.csv row."""
    n, tp = int(row["num_tokens"]), int(row["num_tensor_parallel_workers"])
    h, heads, kv = int(row["n_embd"]), int(row["n_head"]), int(row["n_kv_head"])
    inter, d = int(row["n_expanded_embd"]), int(row["n_embd"]) // int(row["n_head"])
    gates = 2 if row["use_gated_mlp"] else 1
    ms = {k.split(".")[1]: v for k, v in row.items() if k.endswith(".median")}
    gemms = {"attn_pre_proj": (h, (heads + 2 * kv) * d // tp),
             "attn_post_proj": (heads * d // tp, h),
             "mlp_up_proj": (h, gates * inter // tp), "mlp_down_proj": (inter // tp, h)}
    small = {"input_layernorm": 2 * n * h * 2, "post_attention_layernorm": 2 * n * h * 2,
             "attn_rope": 2 * n * (heads + kv) // tp * d * 2,
             "mlp_act": (gates + 1) * n * inter // tp * 2, "add": 3 * n * h * 2}
    out = [OpSample(gpu, "gemm", n, k, m, seconds=ms[op] / 1e3, source=source)
           for op, (k, m) in gemms.items() if ms.get(op, 0) > 0]
    out += [OpSample(gpu, "small", n, moved_bytes=b, seconds=ms[op] / 1e3, source=source)
            for op, b in small.items() if ms.get(op, 0) > 0]
    return out


def vidur_attention(root: Path = DATA_DIR) -> list[OpSample]:
    """FlashAttention prefill and paged decode on A100 (Llama-2-70B shapes, TP 2)."""
    frame = pd.read_csv(root / "vidur" / "compute-2024-early" / "a100" / "attention.csv")
    out = []
    for r in frame.to_dict("records"):
        tp, d = int(r["num_tensor_parallel_workers"]), int(r["n_embd"]) // int(r["n_q_head"])
        qdim, kv_bytes = int(r["n_q_head"]) // tp * d, 2 * int(r["n_kv_head"]) // tp * d * 2
        ctx, batch = int(r["kv_cache_size"]), int(r["batch_size"])
        if r["is_prefill"]:
            chunk = int(r["prefill_chunk_size"])
            pairs = batch * (chunk * ctx + chunk * (chunk + 1) // 2)
            seconds = r["time_stats.attn_prefill.median"] / 1e3
            out.append(OpSample("a100-80gb", "attn_prefill", chunk * batch, qdim, kv_bytes,
                                context=pairs, seconds=seconds, source="vidur attention"))
        else:
            seconds = r["time_stats.attn_decode.median"] / 1e3
            out.append(OpSample("a100-80gb", "attn_decode", batch, qdim, kv_bytes,
                                context=batch * ctx, seconds=seconds, source="vidur attention"))
    return [s for s in out if s.seconds > 0]


def vidur_allreduce(root: Path = DATA_DIR) -> list[tuple[str, int, int, float]]:
    """(gpu, GPUs, message bytes, seconds) from Vidur's NCCL all-reduce tables (one node)."""
    out = []
    for folder, gpu in (("a100_dgx", "a100-80gb"), ("h100_dgx", "h100")):
        frame = pd.read_csv(root / "vidur" / "network" / folder / "all_reduce.csv")
        frame = frame[frame["devices_per_node"] == frame["num_workers"]]
        grouped = frame.groupby(["num_workers", "size"])["time_stats.all_reduce.median"]
        for (workers, size), ms in grouped.median().items():
            out.append((gpu, int(workers), int(size), float(ms) / 1e3))
    return out


def lss_profile_dirs(root: Path = DATA_DIR) -> list[tuple[str, LayerShapes, int, Path]]:
    """(gpu, model shapes, tp, folder) of every LLMServingSim per-layer profile."""
    out = []
    for folder in sorted((root / "llmservingsim" / "profiler" / "perf").glob("*/*/*/bf16/tp*")):
        gpu, model = LSS_GPUS[folder.parts[-5]], known_shapes(LSS_MODELS[folder.parts[-3]])
        out.append((gpu, model, int(folder.name[2:]), folder))
    return out


def lss_samples(root: Path = DATA_DIR) -> list[OpSample]:
    """GEMMs, small ops, attention, sampler and MoE layers from LLMServingSim's profiles."""
    out: list[OpSample] = []
    for gpu, shapes, tp, folder in lss_profile_dirs(root):
        source = f"llmservingsim {shapes.name} tp{tp}"
        out += _lss_dense(gpu, shapes, tp, pd.read_csv(folder / "dense.csv"), source)
        out += _lss_attention(gpu, shapes, tp, pd.read_csv(folder / "attention.csv"), source)
        out += _lss_per_sequence(gpu, shapes, tp, pd.read_csv(folder / "per_sequence.csv"),
                                 source)
        if (folder / "moe.csv").exists():
            frame = pd.read_csv(folder / "moe.csv")
            out += [OpSample(gpu, "moe", int(r.tokens), shapes.hidden_size,
                             shapes.moe_intermediate_size // tp, experts=int(r.activated_experts),
                             seconds=r.time_us / 1e6, source=source)
                    for r in frame.itertuples(index=False)]
    return out


def _lss_dense(gpu: str, s: LayerShapes, tp: int, frame: pd.DataFrame,
               source: str) -> list[OpSample]:
    h, d, q, kv = s.hidden_size, s.head_dim, s.num_heads // tp, max(1, s.num_kv_heads // tp)
    inter = s.intermediate_size // tp
    gemms = {"qkv_proj": (h, (q + 2 * kv) * d), "o_proj": (q * d, h),
             "gate_up_proj": (h, 2 * inter), "down_proj": (inter, h)}
    out = []
    for r in frame.itertuples(index=False):
        n, seconds = int(r.tokens), r.time_us / 1e6
        if r.layer in gemms:
            k, m = gemms[r.layer]
            out.append(OpSample(gpu, "gemm", n, k, m, seconds=seconds, source=source))
            continue
        moved = {"layernorm": 4 * n * h * 2, "final_layernorm": 4 * n * h * 2,
                 "rotary_emb": 2 * n * (q + kv) * d * 2, "act_fn": 3 * n * inter * 2,
                 "qk_norm": 2 * n * (q + kv) * d * 2, "embedding": 2 * n * h * 2}.get(r.layer)
        if moved:
            out.append(OpSample(gpu, "small", n, moved_bytes=moved, seconds=seconds,
                                source=source))
    return out


def _lss_attention(gpu: str, s: LayerShapes, tp: int, frame: pd.DataFrame,
                   source: str) -> list[OpSample]:
    qdim = s.num_heads // tp * s.head_dim
    kv_bytes = 2 * max(1, s.num_kv_heads // tp) * s.head_dim * 2
    pre = frame[(frame.n_decode == 0) & (frame.prefill_chunk > 0)]
    dec = frame[(frame.prefill_chunk == 0) & (frame.n_decode > 0)]
    out = []
    for r in pre.itertuples(index=False):
        c, ctx = int(r.prefill_chunk), int(r.kv_prefill)
        out.append(OpSample(gpu, "attn_prefill", c, qdim, kv_bytes,
                            context=c * ctx + c * (c + 1) // 2, seconds=r.time_us / 1e6,
                            source=source))
    for r in dec.itertuples(index=False):
        out.append(OpSample(gpu, "attn_decode", int(r.n_decode), qdim, kv_bytes,
                            context=int(r.n_decode) * int(r.kv_decode),
                            seconds=r.time_us / 1e6, source=source))
    return out


def _lss_per_sequence(gpu: str, s: LayerShapes, tp: int, frame: pd.DataFrame,
                      source: str) -> list[OpSample]:
    out = []
    for r in frame.itertuples(index=False):
        n, seconds = int(r.sequences), r.time_us / 1e6
        if r.layer == "lm_head":
            out.append(OpSample(gpu, "gemm", n, s.hidden_size, s.vocab_size // tp,
                                seconds=seconds, source=source))
        elif r.layer == "sampler":
            out.append(OpSample(gpu, "sampler", n, seconds=seconds, source=source))
    return out


def lss_mixed_attention(root: Path = DATA_DIR) -> list[tuple[str, int, int, float]]:
    """(gpu, decode rows, KV tokens per row, extra reads) of every mixed attention shot.

    A mixed shot runs a prefill chunk and n decode rows in one varlen kernel. Its decode part
    (the shot less the same chunk alone) over the same rows in a decode-only kernel is
    1 + (g - 1) x extra, g the query heads per KV head on one GPU: the varlen kernel reads a
    decode row's KV once per query head, not once per KV head, and `extra` is the fraction
    of those repeated reads that cost bandwidth (the rest hit in cache)."""
    out = []
    for gpu, s, tp, folder in lss_profile_dirs(root):
        group = (s.num_heads // tp) / max(1, s.num_kv_heads // tp)
        if group <= 1:
            continue
        frame = pd.read_csv(folder / "attention.csv")
        alone = frame[frame.n_decode == 0].set_index(["prefill_chunk", "kv_prefill"]).time_us
        decode = frame[frame.prefill_chunk == 0].set_index(["n_decode", "kv_decode"]).time_us
        mixed = frame[(frame.prefill_chunk > 0) & (frame.n_decode > 0)]
        for r in mixed.itertuples(index=False):
            chunk = alone.get((r.prefill_chunk, r.kv_prefill))
            rows = decode.get((r.n_decode, r.kv_decode))
            if chunk is None or rows is None or rows <= 0:
                continue
            extra = ((r.time_us - chunk) / rows - 1.0) / (group - 1.0)
            out.append((gpu, int(r.n_decode), int(r.kv_decode), float(extra)))
    return out
