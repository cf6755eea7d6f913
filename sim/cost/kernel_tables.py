"""vLLM's measured kernel latencies for one GPU and vLLM version (sim/data/aiconfigurator/).

`KernelTables.load(gpu, version)` reads the compact tables `sim/data/aiconfigurator/
extract.py` derives from ai-dynamo/aiconfigurator (Apache-2.0; README there) and answers
per-shape questions with `Curve`s (sim.cost.kernel_curves) a cost model builds once per
deployment: a GEMM's latency against its rows, attention against batch and length, a MoE
layer against its tokens, an all-reduce against its bytes. A shape the tables do not hold
raises KernelTableError naming it; how each gap is bridged is in docs/kernels.md.
"""

from __future__ import annotations

import functools
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.cost.kernel_collectives import AllReduce, custom_max_bytes
from sim.cost.kernel_curves import (
    Curve,
    Grid,
    blend,
    bracket,
    graph_replayed_block,
    pointwise,
)

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "aiconfigurator"


class KernelTableError(ValueError):
    """The measured tables cannot price this: GPU, version, quantization or shape missing."""


def manifest(data_dir: Path = DATA_DIR) -> dict[str, Any]:
    """The extraction's manifest: source, commit, licence, and per GPU what came from where."""
    return _manifest(data_dir)


@functools.cache
def _manifest(data_dir: Path) -> dict[str, Any]:
    path = data_dir / "manifest.json"
    if not path.exists():
        return {"gpus": {}}
    return json.loads(path.read_text())


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


REQUIRED = ("gemm", "context_attention", "generation_attention")


def measured_versions(gpu: str, data_dir: Path = DATA_DIR) -> tuple[str, ...]:
    """vLLM versions with GEMM and both attention tables on `gpu`, oldest first."""
    tables = _manifest(data_dir)["gpus"].get(gpu, {}).get("tables", {})
    if not all(name in tables for name in REQUIRED):
        return ()
    common = set.intersection(*(set(tables[name]) for name in REQUIRED))
    return tuple(sorted(common, key=_version_key))


def newest_version(gpu: str, data_dir: Path = DATA_DIR) -> str | None:
    """The newest measured vLLM version on `gpu`, or None when it has no tables."""
    versions = measured_versions(gpu, data_dir)
    return versions[-1] if versions else None


@functools.cache
def _columns(path: Path) -> dict[str, np.ndarray]:
    """A table's columns as arrays (pyarrow imported only when tables are used)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return {name: table.column(name).to_numpy() for name in table.column_names}


def _rows(path: Path, version: str | None, **match: Any) -> dict[str, np.ndarray]:
    """The columns of the rows of one source version (None: any) whose columns equal
    `match`."""
    cols = _columns(path)
    keep = np.ones(len(cols["latency_ms"]), dtype=bool)
    if version is not None:
        keep &= cols["source_version"] == version
    for key, value in match.items():
        keep &= cols[key] == value
    return {key: column[keep] for key, column in cols.items()}


@dataclass(frozen=True)
class KernelTables:
    """One GPU's tables at one vLLM version, with the source version of each."""

    gpu: str
    vllm_version: str
    data_dir: Path = DATA_DIR
    sources: dict[str, str] = field(default_factory=dict)  # table -> source version read

    @classmethod
    def load(cls, gpu: str, vllm_version: str | None = None,
             data_dir: Path = DATA_DIR) -> KernelTables:
        """The tables of `gpu` at `vllm_version` (default: the newest measured)."""
        versions = measured_versions(gpu, data_dir)
        if not versions:
            raise KernelTableError(f"no vLLM kernel tables for GPU {gpu!r} (measured: "
                                   f"{', '.join(available_gpus(data_dir)) or 'none'})")
        version = vllm_version or versions[-1]
        if version not in versions:
            raise KernelTableError(f"--vllm-version {version}: {gpu} has kernel tables for "
                                   f"vLLM {', '.join(versions)}")
        tables = _manifest(data_dir)["gpus"][gpu]["tables"]
        sources = {name: tables[name][version]["source_version"] for name in REQUIRED}
        if version in tables.get("moe", {}):
            sources["moe"] = tables["moe"][version]["source_version"]
        car = tables.get("custom_all_reduce", {})
        if car:  # communication hardly depends on vLLM: this version's, else the nearest older
            older = [v for v in car if _version_key(v) <= _version_key(version)]
            pick = max(older, key=_version_key) if older else min(car, key=_version_key)
            sources["custom_all_reduce"] = car[pick]["source_version"]
        return cls(gpu, version, data_dir, sources)

    def _path(self, table: str) -> Path:
        return self.data_dir / self.gpu / f"{table}.parquet"

    def _fill_version(self, table: str, quant: str) -> str:
        """The source version holding `quant` for this version (a donor fills gaps)."""
        entry = _manifest(self.data_dir)["gpus"][self.gpu]["tables"][table][self.vllm_version]
        fill = entry.get("fill")
        if fill and quant in fill["quants"]:
            return fill["source_version"]
        return entry["source_version"]

    def describe(self) -> str:
        """One line: what priced the kernels (for a run's printed config)."""
        commit = _manifest(self.data_dir).get("commit", "?")[:10]
        version = self.vllm_version
        reused = sorted({v for name, v in self.sources.items()
                         if name != "custom_all_reduce" and v != version})
        note = (f"; some tables are vLLM {', '.join(reused)}'s, which upstream reuses for "
                f"{version}" if reused else "")
        car = self.sources.get("custom_all_reduce", version)
        if car != version:
            note += f"; custom all-reduce as measured with vLLM {car}"
        return (f"vLLM {version} kernel tables measured on {self.gpu} "
                f"(aiconfigurator {commit}){note}")

    # ---- GEMM -------------------------------------------------------------------------

    def gemm(self, quant: str, n: int, k: int) -> Curve:
        """A [m, k] x [k, n] GEMM's latency (ms) against m: the measured (n, k), else the
        log-space blend of the measured ones around it, else the nearest edge scaled by
        FLOPs (n x k) beyond the measured range. Block-scaled fp8 as a CUDA graph replays it
        (graph_replayed_block)."""
        if quant == "fp8_block" and "fp8" in self.gemm_quants():
            return graph_replayed_block(self._measured_gemm(quant, n, k),
                                        self._measured_gemm("fp8", n, k))
        return self._measured_gemm(quant, n, k)

    def _measured_gemm(self, quant: str, n: int, k: int) -> Curve:
        grid = _gemm_grid(self._path("gemm"), self._fill_version("gemm", quant), quant)
        if not grid:
            raise KernelTableError(f"{self.gpu} vLLM {self.vllm_version}: no {quant} GEMM "
                                   "table (measured quantizations: "
                                   f"{', '.join(self.gemm_quants()) or 'none'})")
        ns = sorted({nk[0] for nk in grid})
        ks = sorted({nk[1] for nk in grid})
        n_points, n_scale = bracket(ns, n)
        k_points, k_scale = bracket(ks, k)
        parts = []
        for nn, wn in n_points:
            for kk, wk in k_points:
                if (nn, kk) not in grid:
                    raise KernelTableError(f"{self.gpu} {quant} GEMM n={nn} k={kk} missing")
                parts.append((grid[(nn, kk)], wn * wk))
        return blend(parts, n_scale * k_scale)

    def gemm_quants(self) -> list[str]:
        """The GEMM quantizations measured for this version (its donor's included)."""
        entry = _manifest(self.data_dir)["gpus"][self.gpu]["tables"]["gemm"][self.vllm_version]
        return sorted({*entry["quants"], *entry.get("fill", {}).get("quants", ())})

    # ---- attention --------------------------------------------------------------------

    def kv_cache_dtypes(self, table: str) -> list[str]:
        """The KV caches an attention table measured at this version: "auto" (the 16-bit
        dtype) and, where measured, "fp8"."""
        entry = _manifest(self.data_dir)["gpus"][self.gpu]["tables"][table][self.vllm_version]
        return sorted(entry.get("kv_cache_dtypes", {"auto": None}))

    def context_attention(self, heads: int, kv_heads: int, head_dim: int,
                          kv: str = "auto") -> tuple[Grid, str]:
        """Prefill attention (ms) by (batch, sequence length) for one GPU's heads over a KV
        cache `kv` (kv_cache_dtypes), and a note when the heads were not measured (priced
        from the nearest, scaled by query heads: prefill attention's FLOPs)."""
        return self._attention("context_attention", "seq", 2.0, heads, kv_heads, head_dim,
                               by_kv=False, kv=kv)

    def generation_attention(self, heads: int, kv_heads: int, head_dim: int,
                             kv: str = "auto") -> tuple[Grid, str]:
        """Decode attention (ms) by (batch, KV length per sequence) over a KV cache `kv`,
        and a note when the heads were not measured (priced from the nearest, scaled by KV
        heads: the KV bytes decode reads)."""
        return self._attention("generation_attention", "kv_len", 1.0, heads, kv_heads,
                               head_dim, by_kv=True, kv=kv)

    def _attention(self, table: str, length: str, power: float, heads: int, kv_heads: int,
                   head_dim: int, by_kv: bool, kv: str) -> tuple[Grid, str]:
        if kv not in self.kv_cache_dtypes(table):
            raise KernelTableError(f"{self.gpu} vLLM {self.vllm_version}: no {table} "
                                   f"measured with a {kv} KV cache")
        shapes = _attention_shapes(self._path(table), self.sources[table], kv)
        if (heads, kv_heads, head_dim) in shapes:
            return _attention_grid(self._path(table), self.sources[table], length, power,
                                   heads, kv_heads, head_dim, kv), ""
        same_dim = [s for s in shapes if s[2] == head_dim]
        if not same_dim:
            raise KernelTableError(f"{self.gpu} vLLM {self.vllm_version}: no {table} "
                                   f"measured at head_dim {head_dim}")
        group = heads / kv_heads

        def distance(s: tuple[int, int, int]) -> tuple[float, float]:
            return (abs(math.log(s[0] / s[1]) - math.log(group)), abs(math.log(s[0] / heads)))

        near = min(same_dim, key=distance)
        grid = _attention_grid(self._path(table), self.sources[table], length, power, *near,
                               kv)
        scale = kv_heads / near[1] if by_kv else heads / near[0]
        rows = {b: blend([(c, 1.0)], scale) for b, c in grid.rows.items()}
        note = (f"{table.replace('_', ' ')} of {heads} heads / {kv_heads} KV heads priced "
                f"from the measured {near[0]} / {near[1]}, scaled")
        return Grid(rows), note

    # ---- MoE --------------------------------------------------------------------------

    def moe(self, quant: str, hidden: int, inter: int, experts: int, topk: int, tp: int,
            ep: int) -> Curve:
        """A fused-MoE layer's latency (ms) against the tokens entering it on one GPU: at each
        token count the faster of the routings measured (balanced and a power law, column
        `routing`). A trained router puts a small batch on fewer experts than an even spread
        reads (the power law's rows), and its load-balancing loss spreads a large batch about
        evenly (the balanced rows): the lesser of the two is the layer it runs."""
        if "moe" not in self.sources:
            raise KernelTableError(f"{self.gpu} vLLM {self.vllm_version}: no MoE table")
        path = self._path("moe")
        rows = _rows(path, self._fill_version("moe", quant), quant=quant, hidden=hidden,
                     inter=inter, experts=experts, topk=topk, tp=tp, ep=ep)
        if not len(rows["latency_ms"]):
            raise KernelTableError(
                f"{self.gpu} vLLM {self.vllm_version}: MoE {quant} hidden={hidden} "
                f"inter={inter} experts={experts} top-{topk} at moe tp={tp} ep={ep} not "
                "measured")
        curves = [Curve(rows["tokens"][rows["routing"] == routing].tolist(),
                        rows["latency_ms"][rows["routing"] == routing].tolist())
                  for routing in sorted(set(rows["routing"].tolist()))]
        return pointwise(curves, min)

    # ---- all-reduce -------------------------------------------------------------------

    def all_reduce(self, num_gpus: int) -> AllReduce:
        """vLLM's all-reduce over `num_gpus` GPUs: custom below its size limit, NCCL above."""
        custom = None
        limit = custom_max_bytes(self.gpu, num_gpus)
        if "custom_all_reduce" in self.sources and limit:
            rows = _rows(self._path("custom_all_reduce"), self.sources["custom_all_reduce"],
                         num_gpus=num_gpus)
            if len(rows["latency_ms"]):
                custom = Curve(rows["message_bytes"].tolist(), rows["latency_ms"].tolist())
        nccl_path = self._path("nccl_all_reduce")
        nccl = None
        if nccl_path.exists():
            rows = _rows(nccl_path, None, num_gpus=num_gpus)
            if len(rows["latency_ms"]):
                nccl = Curve(rows["message_bytes"].tolist(), rows["latency_ms"].tolist())
        if nccl is None:
            if custom is None:
                raise KernelTableError(f"{self.gpu}: no all-reduce measured over {num_gpus} "
                                       "GPUs")
            limit = float("inf")  # only the custom one was measured: it prices every size
        return AllReduce(custom, nccl, limit if custom is not None else 0)

    def exchange(self, num_gpus: int) -> Curve | None:
        """vLLM's default exchange of expert-parallel tokens between data-parallel ranks
        over `num_gpus` GPUs: an NCCL all-gather of every rank's tokens in, a reduce-scatter
        out (ms against the gathered buffer's bytes); None where either was not measured."""
        curves = []
        for name in ("nccl_all_gather", "nccl_reduce_scatter"):
            path = self._path(name)
            rows = _rows(path, None, num_gpus=num_gpus) if path.exists() else {}
            if not len(rows.get("latency_ms", ())):
                return None
            curves.append(Curve(rows["message_bytes"].tolist(), rows["latency_ms"].tolist()))
        return pointwise(curves, sum)


def available_gpus(data_dir: Path = DATA_DIR) -> list[str]:
    """GPUs with at least one fully measured vLLM version."""
    return sorted(g for g in _manifest(data_dir)["gpus"] if measured_versions(g, data_dir))


@functools.cache
def _gemm_grid(path: Path, version: str, quant: str) -> dict[tuple[int, int], Curve]:
    rows = _rows(path, version, quant=quant)
    points: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    for m, n, k, t in zip(rows["m"].tolist(), rows["n"].tolist(), rows["k"].tolist(),
                          rows["latency_ms"].tolist(), strict=True):
        points[(n, k)].append((m, t))
    return {nk: Curve(*zip(*pts, strict=True)) for nk, pts in points.items()}


def _kv_match(path: Path, kv: str) -> dict[str, str]:
    """The rows of one KV cache dtype (a table without the `kv` column holds 16-bit KV)."""
    return {"kv": kv} if "kv" in _columns(path) else {}


@functools.cache
def _attention_shapes(path: Path, version: str, kv: str) -> frozenset[tuple[int, int, int]]:
    rows = _rows(path, version, **_kv_match(path, kv))
    return frozenset(zip(rows["heads"].tolist(), rows["kv_heads"].tolist(),
                         rows["head_dim"].tolist(), strict=True))


@functools.cache
def _attention_grid(path: Path, version: str, length: str, power: float, heads: int,
                    kv_heads: int, head_dim: int, kv: str) -> Grid:
    rows = _rows(path, version, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                 **_kv_match(path, kv))
    by_batch: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for b, x, t in zip(rows["batch"].tolist(), rows[length].tolist(),
                       rows["latency_ms"].tolist(), strict=True):
        by_batch[b].append((x, t))
    return Grid({b: Curve(*zip(*pts, strict=True), power=power) for b, pts in by_batch.items()})
