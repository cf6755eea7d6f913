"""Regenerate servelab's compact kernel tables from a mirror of ai-dynamo/aiconfigurator.

    python sim/data/aiconfigurator/extract.py PATH_TO_MIRROR [--commit REV]

PATH_TO_MIRROR is a clone (bare or not) of https://github.com/ai-dynamo/aiconfigurator; the
tables are read with `git show REV:path`, so no checkout is needed. For every GPU servelab
ships that the repository measured with vLLM, it writes one folder beside this script:

    <gpu>/gemm.parquet                  quant, m, n, k, latency_ms
    <gpu>/context_attention.parquet     kv, batch, seq, heads, kv_heads, head_dim, latency_ms
    <gpu>/generation_attention.parquet  kv, batch, kv_len, heads, kv_heads, head_dim,
                                        latency_ms
    <gpu>/moe.parquet                   routing, quant, tokens, hidden, inter, experts, topk,
                                        tp, ep, latency_ms
    <gpu>/custom_all_reduce.parquet     num_gpus, message_bytes, latency_ms
    <gpu>/nccl_all_reduce.parquet       num_gpus, message_bytes, latency_ms
    <gpu>/nccl_all_gather.parquet       (the same columns; message_bytes: the gathered
    <gpu>/nccl_reduce_scatter.parquet    buffer, every rank's share)
    manifest.json                       per GPU and vLLM version, which source table (path,
                                        version) each of ours came from, and the licence

Every table but NCCL's carries a `source_version` column: a vLLM version folder upstream
that holds only a reuse.yaml (or lacks one quantization) points at its donor's rows in the
manifest instead of copying them. What is kept and why is in README.md beside this file.
The module reads nothing at servelab's run time; sim.cost.kernel_tables loads its output.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
from pathlib import Path

import pandas as pd
import yaml

HERE = Path(__file__).parent
SYSTEMS = "aic-core/src/aiconfigurator_core/systems"
DATA = f"{SYSTEMS}/data"
UPSTREAM = "https://github.com/ai-dynamo/aiconfigurator"
# The MoE rows kept, by how upstream routed their tokens to experts: "balanced" (every expert
# the same share) and the power law of exponent 1.2 (what AIConfigurator prices its generic
# MoE models with: Qwen3-MoE, gpt-oss, MiniMax-M2). sim.cost.kernel_tables reads both.
MOE_ROUTINGS = ("balanced", "power_law_1.2")

# servelab's GPU file name -> aiconfigurator's system name (vLLM data measured there).
GPUS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "l40s": "l40s",
        "rtx-pro-6000": "rtx_pro_6000_server", "a100-80gb": "a100_sxm"}
# Upstream's dtype names -> ours. nvfp4 and the other 4-bit lanes are dropped: servelab
# prices no such quantization (sim.cost.roofline.QUANTIZATIONS).
QUANTS = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8", "fp8_block": "fp8_block"}
# The MoE table also keeps MXFP4 experts with 16-bit activations (gpt-oss's checkpoint format,
# which vLLM runs weight-only where the GPU has no FP4 tensor cores).
MOE_QUANTS = {**QUANTS, "w4a16_mxfp4": "mxfp4"}
# Bytes of one element of each collective dtype: both all-reduce tables count message_size
# in ELEMENTS (aiconfigurator's collector/network/collect_nccl.py writes size //
# bytes_per_element; the vLLM custom all-reduce collector counts tensor elements). We store
# bytes.
ELEMENT_BYTES = {"half": 2, "bfloat16": 2, "float16": 2, "int8": 1}


class Mirror:
    """Files of one commit of the mirror, read with git (no checkout)."""

    def __init__(self, path: Path, rev: str) -> None:
        self.path = path
        self.commit = self._git("rev-parse", rev).decode().strip()

    def _git(self, *args: str) -> bytes:
        return subprocess.run(["git", "-C", str(self.path), *args], check=True,
                              capture_output=True).stdout

    def names(self, folder: str) -> list[str]:
        """Entry names directly under `folder` (empty when it does not exist)."""
        try:
            out = self._git("ls-tree", "--name-only", f"{self.commit}:{folder}")
        except subprocess.CalledProcessError:
            return []
        return out.decode().split()

    def read(self, path: str) -> bytes:
        return self._git("show", f"{self.commit}:{path}")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def _table_sources(mirror: Mirror, system: str, family: str, framework: str,
                   table: str) -> dict[str, dict[str, str]]:
    """version -> {"own": version whose parquet it has, "donor": reuse.yaml's from_version}
    for one upstream table (either key may be missing)."""
    out: dict[str, dict[str, str]] = {}
    root = f"{DATA}/{system}/{family}/{framework}"
    for version in mirror.names(root):
        files = mirror.names(f"{root}/{version}")
        entry: dict[str, str] = {}
        if f"{table}.parquet" in files:
            entry["own"] = version
        if "reuse.yaml" in files:
            reuse = yaml.safe_load(mirror.read(f"{root}/{version}/reuse.yaml")) or {}
            for item in reuse.get("reuse", []):
                if item.get("table") == table:
                    entry["donor"] = str(item["from_version"])
        if entry:
            out[version] = entry
    return out


def _read(mirror: Mirror, system: str, family: str, framework: str, version: str,
          table: str) -> tuple[pd.DataFrame, str]:
    path = f"{DATA}/{system}/{family}/{framework}/{version}/{table}.parquet"
    return pd.read_parquet(io.BytesIO(mirror.read(path))), path


def _gemm(frame: pd.DataFrame) -> pd.DataFrame:
    """Dense GEMMs per (quant, m, n, k); several kernels for one quant keep the fastest
    (vLLM picks among them by platform; the fastest is what its selection aims at)."""
    frame = frame[frame["gemm_dtype"].isin(QUANTS)]
    out = pd.DataFrame({"quant": frame["gemm_dtype"].map(QUANTS), "m": frame["m"],
                        "n": frame["n"], "k": frame["k"], "latency_ms": frame["latency"]})
    return out.groupby(["quant", "m", "n", "k"], as_index=False)["latency_ms"].min()


def _attention_rows(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """Rows servelab can use, labelled by KV cache (column `kv`: "auto" where the cache is
    in the attention's own 16-bit dtype, "fp8" for an FP8 cache), no sliding window, and per
    label one kernel: the GPU's most measured one (vLLM's default backend there)."""
    for column, value in (("window_size", 0), ("beam_width", 1)):  # older tables lack them
        if column in frame:
            frame = frame[frame[column] == value]
    parts, kernels = [], {}
    for kv, keep in (("auto", frame["kv_cache_dtype"] == frame["attn_dtype"]),
                     ("fp8", frame["kv_cache_dtype"] == "fp8")):
        part = frame[keep]
        if part.empty:
            continue
        kernel = "unnamed"
        if "kernel_source" in part:
            kernel = part["kernel_source"].value_counts().idxmax()
            part = part[part["kernel_source"] == kernel]
        parts.append(part.assign(kv=kv))
        kernels[kv] = kernel
    return (pd.concat(parts) if parts else frame.iloc[:0].assign(kv="auto")), kernels


def _context_attention(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    frame, kernels = _attention_rows(frame)
    out = pd.DataFrame({"kv": frame["kv"], "batch": frame["batch_size"], "seq": frame["isl"],
                        "heads": frame["num_heads"], "kv_heads": frame["num_key_value_heads"],
                        "head_dim": frame["head_dim"], "latency_ms": frame["latency"]})
    keys = ["kv", "batch", "seq", "heads", "kv_heads", "head_dim"]
    return out.groupby(keys, as_index=False)["latency_ms"].median(), kernels


def _generation_attention(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """Decode attention; a row's KV length is isl + step (isl 1, step 2^i - 1)."""
    frame, kernels = _attention_rows(frame)
    out = pd.DataFrame({"kv": frame["kv"], "batch": frame["batch_size"],
                        "kv_len": frame["isl"] + frame["step"],
                        "heads": frame["num_heads"], "kv_heads": frame["num_key_value_heads"],
                        "head_dim": frame["head_dim"], "latency_ms": frame["latency"]})
    keys = ["kv", "batch", "kv_len", "heads", "kv_heads", "head_dim"]
    return out.groupby(keys, as_index=False)["latency_ms"].median(), kernels


def _moe(frame: pd.DataFrame) -> pd.DataFrame:
    """Fused-MoE layers with tokens routed as MOE_ROUTINGS name (column `routing`)."""
    frame = frame[frame["distribution"].isin(MOE_ROUTINGS)
                  & frame["moe_dtype"].isin(MOE_QUANTS)]
    out = pd.DataFrame({"routing": frame["distribution"],
                        "quant": frame["moe_dtype"].map(MOE_QUANTS), "tokens": frame["num_tokens"],
                        "hidden": frame["hidden_size"], "inter": frame["inter_size"],
                        "experts": frame["num_experts"], "topk": frame["topk"],
                        "tp": frame["moe_tp_size"], "ep": frame["moe_ep_size"],
                        "latency_ms": frame["latency"]})
    keys = ["routing", "quant", "tokens", "hidden", "inter", "experts", "topk", "tp", "ep"]
    return out.groupby(keys, as_index=False)["latency_ms"].min()


def _custom_all_reduce(frame: pd.DataFrame) -> pd.DataFrame:
    """vLLM's custom all-reduce as captured in a CUDA graph (how vLLM runs it in a step)."""
    frame = frame[(frame["op_name"] == "all_reduce") & (frame["backend"] == "vllm_graph")]
    out = pd.DataFrame({"num_gpus": frame["num_gpus"],
                        "message_bytes": frame["message_size"]
                        * frame["allreduce_dtype"].map(ELEMENT_BYTES),
                        "latency_ms": frame["latency"]})
    return out.groupby(["num_gpus", "message_bytes"], as_index=False)["latency_ms"].min()


# NCCL's collectives kept: TP's all-reduce (above the custom one's size limit), and the
# all-gather and reduce-scatter vLLM's default expert-parallel exchange runs between
# data-parallel ranks ("allgather_reducescatter"). nccl-tests sizes both by the whole
# gathered buffer.
NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def _nccl(frame: pd.DataFrame, op: str) -> pd.DataFrame:
    """One NCCL collective over 16-bit elements (message_size counts elements upstream)."""
    frame = frame[(frame["op_name"] == op) & (frame["nccl_dtype"] == "half")]
    out = pd.DataFrame({"num_gpus": frame["num_gpus"],
                        "message_bytes": frame["message_size"] * ELEMENT_BYTES["half"],
                        "latency_ms": frame["latency"]})
    return out.groupby(["num_gpus", "message_bytes"], as_index=False)["latency_ms"].min()


# (our table, upstream family, upstream table, reducer); attention reducers also name
# their kernel.
VLLM_TABLES = (
    ("gemm", "gemm", "gemm_perf", _gemm),
    ("context_attention", "attention", "context_attention_perf", _context_attention),
    ("generation_attention", "attention", "generation_attention_perf", _generation_attention),
    ("moe", "moe", "moe_perf", _moe),
    ("custom_all_reduce", "comm", "custom_allreduce_perf", _custom_all_reduce),
)


def _fill_from_donors(sources: dict[str, dict[str, str]], versions: dict[str, dict]) -> None:
    """Donors fill what a version folder lacks: the whole table, or its missing quants."""
    for version, entry in sources.items():
        donor = entry.get("donor")
        if donor is None or donor not in versions:
            continue
        if version not in versions:
            versions[version] = dict(versions[donor], source_version=donor)
        elif versions[version]["quants"] is not None:  # quants the folder has none of
            missing = sorted(set(versions[donor]["quants"]) - set(versions[version]["quants"]))
            if missing:
                versions[version]["fill"] = {"source_version": donor, "quants": missing,
                                             "path": versions[donor]["path"]}


def _extract_vllm_table(mirror: Mirror, system: str, name: str, family: str, table: str,
                        reduce) -> tuple[pd.DataFrame | None, dict]:
    """One of our tables for one GPU, all vLLM versions stacked (source_version column),
    and the manifest entry: version -> {source version, path, kernel}."""
    sources = _table_sources(mirror, system, family, "vllm", table)
    frames, versions = [], {}
    for version in sorted(sources, key=_version_key):
        if "own" not in sources[version]:
            continue
        raw, path = _read(mirror, system, family, "vllm", version, table)
        reduced = reduce(raw)
        kernels: dict[str, str] = {}
        if isinstance(reduced, tuple):
            reduced, kernels = reduced
        if reduced.empty:  # nothing servelab can use (other dtypes or distributions)
            continue
        reduced.insert(0, "source_version", version)
        frames.append(reduced)
        versions[version] = {"source_version": version, "path": path,
                             "kernel": kernels.get("auto"),
                             "quants": sorted(reduced["quant"].unique())
                             if "quant" in reduced else None}
        if kernels:  # attention: the KV cache dtypes measured, each with its kernel
            versions[version]["kv_cache_dtypes"] = kernels
    _fill_from_donors(sources, versions)
    if not frames:
        return None, {}
    out = pd.concat(frames, ignore_index=True)
    out["source_version"] = out["source_version"].astype("category")
    for column in ("quant", "kv"):
        if column in out:
            out[column] = out[column].astype("category")
    return out, dict(sorted(versions.items(), key=lambda kv: _version_key(kv[0])))


def _extract_nccl(mirror: Mirror, system: str) -> tuple[dict[str, pd.DataFrame], dict]:
    """NCCL_OPS as the newest NCCL version measured on the GPU has them (NCCL's speed
    hardly depends on vLLM): our table name -> rows, and their source."""
    root = f"{DATA}/{system}/comm/nccl"
    versions = [v for v in mirror.names(root) if "nccl_perf.parquet" in mirror.names(f"{root}/{v}")]
    if not versions:
        return {}, {}
    version = max(versions, key=_version_key)
    raw, path = _read(mirror, system, "comm", "nccl", version, "nccl_perf")
    frames = {f"nccl_{op}": _nccl(raw, op) for op in NCCL_OPS}
    return ({name: frame for name, frame in frames.items() if len(frame)},
            {"nccl_version": version, "path": path})


def _compact(frame: pd.DataFrame) -> pd.DataFrame:
    """Smallest lossless integer types, float32 latency (a 1e-7 relative rounding)."""
    for column in frame.columns:
        if column == "latency_ms":
            frame[column] = frame[column].astype("float32")
        elif pd.api.types.is_integer_dtype(frame[column]):
            frame[column] = pd.to_numeric(frame[column], downcast="integer")
    return frame


def extract(mirror: Mirror, out_dir: Path = HERE) -> dict:
    """Write every GPU's tables under out_dir and return the manifest (also written)."""
    manifest = {"source": UPSTREAM, "commit": mirror.commit, "license": "Apache-2.0",
                "license_file": "LICENSE", "systems_path": SYSTEMS, "gpus": {}}
    for gpu, system in GPUS.items():
        folder = out_dir / gpu
        for stale in folder.glob("*.parquet"):  # a table upstream no longer has goes too
            stale.unlink()
        entry = {"system": system, "tables": {}}
        for name, family, table, reduce in VLLM_TABLES:
            frame, versions = _extract_vllm_table(mirror, system, name, family, table, reduce)
            if frame is None:
                continue
            folder.mkdir(parents=True, exist_ok=True)
            _compact(frame).to_parquet(folder / f"{name}.parquet", index=False,
                                       compression="zstd", compression_level=19)
            entry["tables"][name] = versions
        frames, nccl = _extract_nccl(mirror, system)
        for name, frame in frames.items():
            folder.mkdir(parents=True, exist_ok=True)
            _compact(frame).to_parquet(folder / f"{name}.parquet", index=False,
                                       compression="zstd", compression_level=19)
            entry["tables"][name] = nccl
        if entry["tables"]:
            manifest["gpus"][gpu] = entry
    (out_dir / "LICENSE").write_bytes(mirror.read("LICENSE"))
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mirror", type=Path, help="a clone of ai-dynamo/aiconfigurator")
    parser.add_argument("--commit", default="HEAD", help="the revision to read (default HEAD)")
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: here)")
    args = parser.parse_args()
    manifest = extract(Mirror(args.mirror, args.commit), args.out)
    size = sum(p.stat().st_size for p in args.out.rglob("*.parquet"))
    print(f"{len(manifest['gpus'])} GPUs from {manifest['commit'][:12]}: "
          f"{size / 2**20:.1f} MiB of tables in {args.out}")


if __name__ == "__main__":
    main()
