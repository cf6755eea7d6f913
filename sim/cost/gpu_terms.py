"""The fitted terms of the GPU cost model, one GPU's worth, read from
sim/cost/data/gpu_cost_fit.json.

Every operator's time is max(FLOPs / (peak x eff_compute), bytes / (bandwidth x eff_memory))
with efficiencies set by data (servelab/calibration/gpu_fit.py); these functions are the physics
both the fit and the runtime model use, so the two can never disagree.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from sim.cost.gpu_shapes import GpuPeaks

FIT_PATH = Path(__file__).parent / "data" / "gpu_cost_fit.json"


@dataclass(frozen=True)
class GpuTerms:
    """One GPU's fitted efficiencies and latencies (seconds, fractions of datasheet peaks)."""

    name: str
    fitted: bool  # False: the generic terms of the fitted GPUs, scaled by this GPU's datasheet
    source: str  # which data set set these terms
    gemm_tokens: tuple[int, ...]  # token counts of the efficiency table (ascending)
    gemm_eff_compute: tuple[float, ...]  # achieved / peak FLOP/s of a GEMM at those tokens
    gemm_eff_memory: tuple[float, ...]  # achieved / datasheet bandwidth at those tokens
    small_op_floor_s: float  # launch-bound time of one norm/RoPE/activation/add kernel
    small_op_eff_memory: float  # their achieved fraction of bandwidth beyond the floor
    attn_prefill_eff_compute: float  # FlashAttention forward, achieved / peak FLOP/s
    attn_prefill_floor_s: float  # one prefill attention kernel's fixed time, per layer
    attn_decode_eff_memory: float  # paged decode attention, achieved / bandwidth on KV reads
    attn_decode_floor_s: float  # one decode attention kernel's fixed time, per layer
    sampler_floor_s: float  # sampling kernels' fixed time per step
    sampler_per_row_s: float  # sampling time per sampled row
    allreduce: dict[int, tuple[float, float]]  # GPUs -> (latency_s, achieved bus bytes/s)
    moe_eff: float  # fused-MoE kernels' achieved fraction of bandwidth on expert weights
    # Sections this GPU's own data did not set (taken from the generic terms).
    borrowed: tuple[str, ...] = ()
    gemm_latency_s: float = 0.0  # fixed time of one GEMM kernel (launch, tail wave)
    moe_compute_scale: float = 1.0  # fused-MoE FLOP/s as a fraction of a dense GEMM's
    # Decode rows sharing a varlen kernel with a prefill chunk: the fraction of their
    # per-query-head KV re-reads that cost bandwidth, by decode rows x KV tokens per row.
    mixed_rows: tuple[int, ...] = (1,)
    mixed_kv: tuple[int, ...] = (1,)
    mixed_extra: tuple[tuple[float, ...], ...] = ((0.0,),)

    def mixed_decode_factor(self, rows: int, kv_per_row: float, group: float) -> float:
        """What decode attention costs beside a prefill chunk over what it costs alone:
        1 + (group - 1) x extra, extra linear between table points and clamped at its edges
        (group: query heads per KV head; 1 re-reads nothing)."""
        if group <= 1.0:
            return 1.0
        i, u = _bracket(self.mixed_rows, rows)
        j, v = _bracket(self.mixed_kv, kv_per_row)
        e = self.mixed_extra
        lo = e[i][j] + v * (e[i][j + 1] - e[i][j]) if v else e[i][j]
        if u:
            hi = e[i + 1][j] + v * (e[i + 1][j + 1] - e[i + 1][j]) if v else e[i + 1][j]
            lo += u * (hi - lo)
        return max(0.0, 1.0 + (group - 1.0) * lo)

    def gemm_eff(self, tokens: float) -> tuple[float, float]:
        """(eff_compute, eff_memory) at `tokens` rows, linear between table points: with the
        fit's eff_compute / rows and eff_memory non-increasing, a GEMM never gets faster
        with more rows."""
        table = self.gemm_tokens
        if tokens <= table[0]:
            return self.gemm_eff_compute[0], self.gemm_eff_memory[0]
        if tokens >= table[-1]:
            return self.gemm_eff_compute[-1], self.gemm_eff_memory[-1]
        i = bisect.bisect_right(table, tokens)
        lo, hi = table[i - 1], table[i]
        w = (tokens - lo) / (hi - lo)
        ec, em = self.gemm_eff_compute, self.gemm_eff_memory
        return ec[i - 1] + w * (ec[i] - ec[i - 1]), em[i - 1] + w * (em[i] - em[i - 1])

    def allreduce_s(self, message_bytes: float, num_gpus: int) -> float:
        """One all-reduce of `message_bytes` over `num_gpus` GPUs (0 on one GPU)."""
        if num_gpus <= 1 or message_bytes <= 0:
            return 0.0
        known = sorted(self.allreduce)
        gpus = min(known, key=lambda g: (abs(g - num_gpus), g))
        latency_s, bus_bytes_s = self.allreduce[gpus]
        # A ring moves 2 (n - 1) / n of the buffer over each link.
        return latency_s + 2 * (num_gpus - 1) / num_gpus * message_bytes / bus_bytes_s


def across_nodes_s(peaks: GpuPeaks, message_bytes: float, num_gpus: int) -> float:
    """What an all-reduce of `message_bytes` over `num_gpus` GPUs adds by spanning nodes of
    peaks.max_gpus (0 within one node). Hierarchical, as NCCL runs it across nodes: reduce-
    scatter within each node, a ring among the nodes over each GPU's network share of its
    1 / max_gpus slice, all-gather within the node; the within-node parts are the node's own
    all-reduce, priced by the caller. ValueError when the GPU gives no network."""
    per_node = peaks.max_gpus
    if num_gpus <= per_node or message_bytes <= 0:
        return 0.0
    if peaks.network_bytes_s is None or peaks.network_latency_s is None:
        raise ValueError(f"{peaks.name}: a collective over {num_gpus} GPUs spans nodes of "
                         f"{per_node}, and the GPU file gives no network_bytes_s / "
                         "network_latency_s to price the hop between them")
    nodes = math.ceil(num_gpus / per_node)
    hops = 2 * (nodes - 1)
    return hops * peaks.network_latency_s + hops / nodes * (
        message_bytes / per_node) / peaks.network_bytes_s


def _bracket(table: tuple[int, ...], x: float) -> tuple[int, float]:
    """(i, w): x lies w of the way from table[i] to table[i + 1]; w = 0 at or past the ends."""
    if x <= table[0]:
        return 0, 0.0
    if x >= table[-1]:
        return len(table) - 1, 0.0
    i = bisect.bisect_right(table, x) - 1
    return i, (x - table[i]) / (table[i + 1] - table[i])


def gemm_s(terms: GpuTerms, peaks: GpuPeaks, tokens: float, k: int, m: int,
           dtype_bytes: int = 2, weight_bytes: int | None = None,
           peak_flops: float | None = None) -> float:
    """One [tokens, k] x [k, m] GEMM: weights read once, activations in and out (weights
    of `weight_bytes` each and FLOPs at `peak_flops` where they differ: FP8 quantization,
    at the efficiencies the 16-bit profiles fitted)."""
    flops = 2.0 * tokens * k * m
    weights = dtype_bytes if weight_bytes is None else weight_bytes
    moved = k * m * weights + tokens * (k + m) * dtype_bytes
    eff_c, eff_m = terms.gemm_eff(tokens)
    peak = peaks.peak_flops if peak_flops is None else peak_flops
    return terms.gemm_latency_s + max(flops / (peak * eff_c),
                                      moved / (peaks.mem_bandwidth_bytes_s * eff_m))


def moe_experts_s(terms: GpuTerms, peaks: GpuPeaks, slots: float, active: float, k: int,
                  inter: int, dtype_bytes: int = 2, weight_bytes: int | None = None,
                  peak_flops: float | None = None) -> float:
    """Fused-MoE gate/up and down over `slots` token-slots routed to `active` experts of
    [k, 2 x inter] and [inter, k]: one kernel each, every active expert's weights read once,
    FLOPs at the GEMM efficiency of the rows each expert receives (weights and peak as
    gemm_s takes them)."""
    flops = 2.0 * slots * 3 * k * inter
    weights = dtype_bytes if weight_bytes is None else weight_bytes
    moved = active * 3 * k * inter * weights + slots * (2 * k + 3 * inter) * dtype_bytes
    eff_c = terms.gemm_eff(slots / active)[0] * terms.moe_compute_scale
    peak = peaks.peak_flops if peak_flops is None else peak_flops
    return 2 * terms.gemm_latency_s + max(flops / (peak * eff_c),
                                          moved / (peaks.mem_bandwidth_bytes_s * terms.moe_eff))


def small_op_s(terms: GpuTerms, peaks: GpuPeaks, moved_bytes: float) -> float:
    """One elementwise/normalisation kernel that moves `moved_bytes` (launch floor + bytes)."""
    return terms.small_op_floor_s + moved_bytes / (
        peaks.mem_bandwidth_bytes_s * terms.small_op_eff_memory)


def load_terms(gpu: str, peaks: GpuPeaks, path: Path = FIT_PATH) -> GpuTerms:
    """The fitted terms of `gpu`; sections its data lacks (all of them for a GPU without
    data) come from the generic terms, with all-reduce bandwidth scaled by its datasheet,
    unless its GPU file gives measured all-reduces."""
    data = json.loads(path.read_text())
    own = data["gpus"].get(gpu, {})
    fitted = bool(own)
    if peaks.allreduce:  # the GPU file's own measurement beats any fitted or scaled curve
        own = {**own, "allreduce": {"by_gpus": {str(n): [lat, bus]
                                                for n, lat, bus in peaks.allreduce}}}
    entry = {**data["generic"], **own}
    allreduce = entry["allreduce"]
    if allreduce.get("scaled_by_interconnect"):
        entry["allreduce"] = {"by_gpus": {n: [lat, frac * peaks.interconnect_bytes_s]
                                          for n, (lat, frac) in allreduce["by_gpus"].items()}}
    terms = terms_from_entry(gpu, entry, fitted=fitted)
    borrowed = tuple(k for k in data["generic"] if k[0] != "_" and k != "source"
                     and k not in own)
    return replace(terms, borrowed=borrowed)


def terms_from_entry(name: str, entry: dict, fitted: bool) -> GpuTerms:
    """Build GpuTerms from one JSON entry (the layout servelab/calibration/gpu_fit.py writes)."""
    try:
        gemm, small = entry["gemm"], entry["small_op"]
        pre, dec, sam = entry["attn_prefill"], entry["attn_decode"], entry["sampler"]
        mixed = entry["attn_mixed"]
        terms = GpuTerms(
            name=name, fitted=fitted, source=entry["source"],
            gemm_tokens=tuple(gemm["tokens"]), gemm_eff_compute=tuple(gemm["eff_compute"]),
            gemm_eff_memory=tuple(gemm["eff_memory"]),
            small_op_floor_s=small["floor_s"], small_op_eff_memory=small["eff_memory"],
            attn_prefill_eff_compute=pre["eff_compute"], attn_prefill_floor_s=pre["floor_s"],
            attn_decode_eff_memory=dec["eff_memory"], attn_decode_floor_s=dec["floor_s"],
            sampler_floor_s=sam["floor_s"], sampler_per_row_s=sam["per_row_s"],
            allreduce={int(g): (v[0], v[1]) for g, v in entry["allreduce"]["by_gpus"].items()},
            moe_eff=entry["moe"]["eff"], gemm_latency_s=gemm["latency_s"],
            moe_compute_scale=entry["moe"]["compute_scale"],
            mixed_rows=tuple(mixed["decode_rows"]), mixed_kv=tuple(mixed["kv_per_row"]),
            mixed_extra=tuple(tuple(row) for row in mixed["extra"]),
        )
    except KeyError as exc:
        raise ValueError(f"GPU cost fit for {name}: missing field {exc.args[0]!r}") from None
    _check_terms(terms)
    return terms


def _check_terms(terms: GpuTerms) -> None:
    """Efficiencies in (0, 1.2] (a datasheet can understate), times >= 0, table sorted."""
    effs = (*terms.gemm_eff_compute, *terms.gemm_eff_memory, terms.small_op_eff_memory,
            terms.attn_prefill_eff_compute, terms.attn_decode_eff_memory, terms.moe_eff,
            terms.moe_compute_scale)
    if not all(0.0 < e <= 1.2 for e in effs):
        raise ValueError(f"GPU cost fit for {terms.name}: an efficiency outside (0, 1.2]")
    times = (terms.gemm_latency_s, terms.small_op_floor_s, terms.attn_prefill_floor_s,
             terms.attn_decode_floor_s,
             terms.sampler_floor_s, terms.sampler_per_row_s,
             *(v for pair in terms.allreduce.values() for v in pair))
    if not all(t >= 0.0 for t in times):
        raise ValueError(f"GPU cost fit for {terms.name}: a negative time")
    if (len(terms.mixed_extra) != len(terms.mixed_rows)
            or any(len(row) != len(terms.mixed_kv) for row in terms.mixed_extra)
            or list(terms.mixed_rows) != sorted(set(terms.mixed_rows))
            or list(terms.mixed_kv) != sorted(set(terms.mixed_kv))):
        raise ValueError(f"GPU cost fit for {terms.name}: attn_mixed table malformed")
    if list(terms.gemm_tokens) != sorted(set(terms.gemm_tokens)):
        raise ValueError(f"GPU cost fit for {terms.name}: gemm tokens not ascending")
    if not (len(terms.gemm_tokens) == len(terms.gemm_eff_compute)
            == len(terms.gemm_eff_memory) > 0):
        raise ValueError(f"GPU cost fit for {terms.name}: gemm table lengths differ")


def coverage(model_name: str, gpu: str, max_tokens: int, path: Path = FIT_PATH) -> str:
    """One line: whether the GPU, the model and the step shapes lie inside the fitted data."""
    entry = json.loads(path.read_text())["gpus"].get(gpu)
    if entry is None:
        return (f"GPU {gpu} outside the fitted data: extrapolated from its datasheet with the "
                f"fitted GPUs' median efficiencies")
    wanted = model_name.lower().replace("meta-", "").split("/")[-1]
    # Each profile reads "<source> <model> [tpN]"; a fine-tuned variant (-Instruct-2507)
    # has its base model's shapes.
    names = {p.split()[1].lower().replace("meta-", "").removesuffix("-hf")
             for p in entry["covered"]["profiles"]}
    profiled = any(name == wanted or wanted.startswith(name + "-") for name in names)
    model_note = ("model profiled on it" if profiled
                  else f"model {model_name} not profiled there: priced by the GPU's fitted curves")
    limit = entry["covered"]["max_tokens"]
    shape_note = (f"steps up to {max_tokens} tokens inside the profiled {limit}"
                  if max_tokens <= limit else
                  f"steps up to {max_tokens} tokens beyond the profiled {limit}: extrapolated")
    return f"GPU {gpu} fitted ({entry['source']}); {model_note}; {shape_note}"
