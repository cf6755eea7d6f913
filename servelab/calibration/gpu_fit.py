"""Fit the GPU cost model on published OPERATOR profiles; writes sim/cost/data/gpu_cost_fit.json.

Fitted on: Vidur's per-operator times (A100, H100: GEMMs, small ops), Vidur's A100 attention
and NCCL all-reduce tables, LLMServingSim's per-layer vLLM profiles (RTX 4090, RTX PRO 6000:
GEMMs, small ops, attention, sampler, MoE). Never on whole steps or whole runs, except the
eager engine's per-layer dispatch time, set on Splitwise's BLOOM-176B steps (a model the
validation never uses; see servelab/calibration/gpu_engine.py).

    python -m servelab.calibration.gpu_fit
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np

from servelab.calibration.gpu_profiles import (
    OpSample,
    lss_mixed_attention,
    lss_samples,
    vidur_allreduce,
    vidur_attention,
    vidur_samples,
)
from sim.cost.gpu_shapes import known_gpu
from sim.cost.gpu_terms import FIT_PATH

# Efficiency table points: powers of two; a sample counts at the nearest one in log scale.
GEMM_TOKENS = tuple(2**i for i in range(16))
EFF_CAP = 1.2  # a measured kernel may beat a rounded datasheet figure, not by more
PERCENTILES = (50, 60, 70, 80, 85, 90, 95, 98, 100)  # candidate efficiencies per row bin
GEMM_LATENCIES_S = (0.0, 2e-6, 4e-6, 6e-6, 8e-6)  # candidate fixed time of one GEMM kernel
# Mixed-batch attention table: KV tokens per decode row (below 256 the shots are floor-bound).
MIXED_KV_PER_ROW = tuple(2**i for i in range(8, 15))


def _fit_gemm_bin(flops_s: np.ndarray, bytes_s: np.ndarray, seconds: np.ndarray,
                  latency_s: float) -> tuple[float, float, float]:
    """(eff_compute, eff_memory, sum |log error|) of one row bin: each efficiency is tried at
    percentiles of the samples' own achieved fractions; the pair with the least error wins."""
    busy = np.maximum(seconds - latency_s, 0.05 * seconds)
    best = (1.0, 1.0, np.inf)
    for eff_c in np.unique(np.percentile(flops_s / busy, PERCENTILES)):
        for eff_m in np.unique(np.percentile(bytes_s / busy, PERCENTILES)):
            predicted = latency_s + np.maximum(flops_s / eff_c, bytes_s / eff_m)
            error = float(np.abs(np.log(predicted / seconds)).sum())
            if error < best[2]:
                best = (float(eff_c), float(eff_m), error)
    return best


def fit_gemm(samples: list[OpSample], gpu: str) -> dict:
    """A kernel latency, and per row count the achieved fractions of peak FLOP/s and of
    bandwidth that price the bin's GEMMs best (least |log error|)."""
    peaks = known_gpu(gpu)
    rows = np.array([s.tokens for s in samples], dtype=float)
    k, m = np.array([s.k for s in samples], float), np.array([s.m for s in samples], float)
    flops_s = 2 * rows * k * m / peaks.peak_flops  # seconds at 100% of peak
    bytes_s = (k * m + rows * (k + m)) * 2 / peaks.mem_bandwidth_bytes_s
    seconds = np.array([s.seconds for s in samples])
    points = np.array(GEMM_TOKENS)[np.minimum(len(GEMM_TOKENS) - 1,
                                              np.round(np.log2(np.maximum(rows, 1))).astype(int))]
    tokens = sorted({int(p) for p in points})
    best: tuple[float, list, list] = (np.inf, [], [])
    for latency_s in GEMM_LATENCIES_S:
        fits = [_fit_gemm_bin(flops_s[points == t], bytes_s[points == t], seconds[points == t],
                              latency_s) for t in tokens]
        error = sum(f[2] for f in fits)
        if error < best[0]:
            best = (error, [f[0] for f in fits], [f[1] for f in fits], latency_s)
    _, eff_c, eff_m, latency_s = best
    # A GEMM's time never falls as rows grow: FLOPs per row are fixed, so the achieved
    # FLOP/s grows at most in proportion to rows, and bytes grow, so bandwidth never rises.
    # (Rounded first, so the file's own numbers keep the two properties.)
    eff_c = list(np.maximum.accumulate([round(min(EFF_CAP, e), 6) for e in eff_c]))
    for i in range(1, len(tokens)):
        eff_c[i] = min(eff_c[i], eff_c[i - 1] * (tokens[i] // tokens[i - 1]))
    eff_m = list(np.minimum.accumulate([round(min(EFF_CAP, e), 6) for e in eff_m]))
    return {"_what": "GEMM: latency + max(FLOPs / (peak x eff_compute), bytes / (bandwidth x "
                     "eff_memory)), efficiencies by rows",
            "latency_s": latency_s, "tokens": tokens,
            "eff_compute": [float(e) for e in eff_c], "eff_memory": [float(e) for e in eff_m]}


def _floor_plus_rate(x: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """Non-negative (floor_s, s per unit of x) minimising relative error."""
    weights = 1.0 / seconds
    design = np.column_stack([np.ones_like(x), x]) * weights[:, None]
    from scipy.optimize import nnls
    (floor_s, rate), _ = nnls(design, seconds * weights)
    return float(floor_s), float(rate)


def fit_small(samples: list[OpSample], gpu: str) -> dict:
    """Norms, RoPE, activation, add, embedding: a launch floor plus bytes at a bandwidth."""
    x = np.array([s.moved_bytes for s in samples])
    floor_s, rate = _floor_plus_rate(x, np.array([s.seconds for s in samples]))
    eff = 1.0 / (rate * known_gpu(gpu).mem_bandwidth_bytes_s) if rate > 0 else EFF_CAP
    return {"_what": "small kernel: floor + bytes / (bandwidth x eff)",
            "floor_s": floor_s, "eff_memory": round(min(EFF_CAP, eff), 4)}


def fit_attention(samples: list[OpSample], gpu: str) -> tuple[dict, dict]:
    """Prefill: floor + causal-pair FLOPs at an efficiency; decode: floor + KV bytes read."""
    peaks = known_gpu(gpu)
    pre = [s for s in samples if s.kind == "attn_prefill"]
    dec = [s for s in samples if s.kind == "attn_decode"]
    x = np.array([4.0 * s.k * s.context for s in pre])
    floor_p, rate_p = _floor_plus_rate(x, np.array([s.seconds for s in pre]))
    x = np.array([float(s.m) * s.context for s in dec])
    floor_d, rate_d = _floor_plus_rate(x, np.array([s.seconds for s in dec]))
    return ({"_what": "prefill attention: floor + 4 x q_dim x causal pairs FLOPs / (peak x eff)",
             "floor_s": floor_p,
             "eff_compute": round(min(EFF_CAP, 1 / (rate_p * peaks.peak_flops)), 4)},
            {"_what": "decode attention: floor + KV bytes read / (bandwidth x eff)",
             "floor_s": floor_d,
             "eff_memory": round(min(EFF_CAP, 1 / (rate_d * peaks.mem_bandwidth_bytes_s)), 4)})


def fit_mixed_attention(shots: list[tuple[str, int, int, float]]) -> dict:
    """The extra-read fraction of decode rows sharing a kernel with a prefill chunk, by decode
    rows and KV tokens per row: the median over every profiled chunk, model and TP."""
    cells: dict[tuple[int, int], list[float]] = defaultdict(list)
    for _, rows, kv, extra in shots:
        if kv in MIXED_KV_PER_ROW:
            cells[rows, kv].append(extra)
    rows = sorted({r for r, _ in cells})
    return {"_what": "decode rows in a mixed prefill+decode kernel read KV once per query "
                     "head: cost x (1 + (q heads per KV head - 1) x extra[rows][kv per row])",
            "decode_rows": rows, "kv_per_row": list(MIXED_KV_PER_ROW),
            "extra": [[round(float(np.median(cells[r, kv])), 3) for kv in MIXED_KV_PER_ROW]
                      for r in rows]}


def fit_sampler(samples: list[OpSample]) -> dict:
    floor_s, rate = _floor_plus_rate(np.array([float(s.tokens) for s in samples]),
                                     np.array([s.seconds for s in samples]))
    return {"_what": "sampling kernels: floor + per sampled row", "floor_s": floor_s,
            "per_row_s": rate}


def fit_allreduce(gpu: str) -> dict:
    """Per GPU count: latency + ring bytes / bus bandwidth, from Vidur's NCCL tables."""
    by_gpus = {}
    rows = [r for r in vidur_allreduce() if r[0] == gpu]
    for n in sorted({r[1] for r in rows}):
        sizes = np.array([float(r[2]) for r in rows if r[1] == n])
        secs = np.array([r[3] for r in rows if r[1] == n])
        latency, rate = _floor_plus_rate(2 * (n - 1) / n * sizes, secs)
        by_gpus[str(n)] = [latency, 1.0 / rate]
    return {"_what": "all-reduce: GPUs -> [latency_s, ring bus bytes/s]", "by_gpus": by_gpus}


def fit_moe(samples: list[OpSample], gemm: dict, gpu: str) -> dict:
    """The fused-MoE kernels' bandwidth fraction on expert weights and FLOP/s relative to the
    dense GEMM curve that price the profiled layers best (least |log error|)."""
    from sim.cost.gpu_terms import GpuTerms, moe_experts_s
    peaks = known_gpu(gpu)
    seconds = np.array([s.seconds for s in samples])

    def error(effs: tuple[float, float]) -> float:
        terms = GpuTerms(gpu, True, "", tuple(gemm["tokens"]), tuple(gemm["eff_compute"]),
                         tuple(gemm["eff_memory"]), 0, 1, 1, 0, 1, 0, 0, 0, {}, effs[0],
                         gemm_latency_s=gemm["latency_s"], moe_compute_scale=effs[1])
        predicted = np.array([moe_experts_s(terms, peaks, s.tokens * 8, s.experts, s.k, s.m)
                              for s in samples])
        return float(np.abs(np.log(predicted / seconds)).sum())

    grid = [(float(m), float(c)) for m in np.linspace(0.3, EFF_CAP, 37)
            for c in np.linspace(0.3, 1.0, 15)]
    eff, scale = min(grid, key=error)
    return {"_what": "fused-MoE kernels: eff = achieved fraction of bandwidth on expert "
                     "weights; compute_scale = their FLOP/s over a dense GEMM's",
            "eff": round(eff, 4), "compute_scale": round(scale, 4)}


def fit_gpu(gpu: str, samples: list[OpSample],
            mixed: list[tuple[str, int, int, float]] = ()) -> dict:
    """Every term one GPU's samples can set; the missing ones come from 'generic'."""
    by_kind: dict[str, list[OpSample]] = defaultdict(list)
    for s in samples:
        by_kind[s.kind].append(s)
    entry = {"source": ", ".join(sorted({s.source.split(" ")[0] for s in samples}))}
    entry["covered"] = {"_what": "the profiles behind these terms and their largest GEMM rows",
                        "profiles": sorted({s.source for s in samples}),
                        "max_tokens": max(s.tokens for s in by_kind["gemm"])}
    entry["gemm"] = fit_gemm(by_kind["gemm"], gpu)
    entry["small_op"] = fit_small(by_kind["small"], gpu)
    if by_kind["attn_prefill"] and by_kind["attn_decode"]:
        entry["attn_prefill"], entry["attn_decode"] = fit_attention(samples, gpu)
    if mixed:
        entry["attn_mixed"] = fit_mixed_attention(mixed)
    if by_kind["sampler"]:
        entry["sampler"] = fit_sampler(by_kind["sampler"])
    if gpu in ("a100-80gb", "h100"):
        entry["allreduce"] = fit_allreduce(gpu)
    if by_kind["moe"]:
        entry["moe"] = fit_moe(by_kind["moe"], entry["gemm"], gpu)
    return entry


def generic_entry(entries: dict[str, dict]) -> dict:
    """Terms for a GPU without data: medians of the fitted GPUs' efficiencies and floors,
    all-reduce bandwidth as their median fraction of the datasheet interconnect."""
    def median_of(section: str, key: str) -> float:
        return float(np.median([e[section][key] for e in entries.values() if section in e]))

    tables = [e["gemm"] for e in entries.values()]
    tokens = sorted(set.intersection(*(set(t["tokens"]) for t in tables)))
    gemm = {"_what": entries[next(iter(entries))]["gemm"]["_what"], "tokens": tokens,
            "latency_s": float(np.median([t["latency_s"] for t in tables]))}
    for key in ("eff_compute", "eff_memory"):
        gemm[key] = [round(float(np.median([t[key][t["tokens"].index(n)] for t in tables])), 4)
                     for n in tokens]
    out = {"source": "median of the fitted GPUs, scaled by this GPU's datasheet", "gemm": gemm}
    for section in ("small_op", "attn_prefill", "attn_decode", "sampler", "moe"):
        sample = next(e[section] for e in entries.values() if section in e)
        out[section] = {k: (v if k == "_what" else median_of(section, k))
                        for k, v in sample.items()}
    mixed = [e["attn_mixed"] for e in entries.values() if "attn_mixed" in e]
    out["attn_mixed"] = {**mixed[0], "extra": np.median([m["extra"] for m in mixed], axis=0)
                         .round(3).tolist()}
    by_gpus: dict[str, list[float]] = {}
    for gpu in ("a100-80gb", "h100"):
        link = known_gpu(gpu).interconnect_bytes_s
        for n, (lat, bus) in entries[gpu]["allreduce"]["by_gpus"].items():
            by_gpus.setdefault(n, []).append((lat, bus / link))
    out["allreduce"] = {
        "_what": "all-reduce: GPUs -> [latency_s, ring bus bandwidth / datasheet interconnect]",
        "scaled_by_interconnect": True,
        "by_gpus": {n: [float(np.median([p[0] for p in v])), float(np.median([p[1] for p in v]))]
                    for n, v in by_gpus.items()}}
    return out


def fit_all() -> dict:
    """The whole JSON: fitted GPUs, generic terms, and the engines' overhead terms."""
    samples = vidur_samples() + vidur_attention() + lss_samples()
    gpus = sorted({s.gpu for s in samples})
    mixed = lss_mixed_attention()
    entries = {g: fit_gpu(g, [s for s in samples if s.gpu == g], [m for m in mixed if m[0] == g])
               for g in gpus}
    data = {"_about": "GPU cost model terms fitted on operator profiles by "
                      "servelab/calibration/gpu_fit.py; each section's _what names the term",
            "gpus": entries, "generic": generic_entry(entries)}
    return data


def main() -> None:
    from servelab.calibration.gpu_engine import engine_entries
    data = fit_all()
    FIT_PATH.parent.mkdir(parents=True, exist_ok=True)
    FIT_PATH.write_text(json.dumps(data, indent=1) + "\n")
    data["engines"] = engine_entries(data)  # priced with the GPU terms just written
    FIT_PATH.write_text(json.dumps(data, indent=1) + "\n")
    for gpu, entry in data["gpus"].items():
        gemm = entry["gemm"]
        print(f"{gpu:14s} gemm eff_c {gemm['eff_compute'][-1]:.2f} eff_m "
              f"{max(gemm['eff_memory']):.2f}  terms: {', '.join(k for k in entry if k[0] != '_')}")
    print(f"wrote {FIT_PATH}")


if __name__ == "__main__":
    main()
