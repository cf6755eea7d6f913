"""GPUs as data: one JSON file per GPU in sim/specs/gpus/ (or any path), read into a HardwareSpec.

A file gives peak dense FLOP/s per dtype, memory size and bandwidth, the GPU-to-GPU and host
links, a price per hour, and a source for each number. Figures are datasheet peaks; the cost
model's efficiency factors, not these files, account for what real kernels achieve.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

GiB = 2**30
GPUS_DIR = Path(__file__).parent / "gpus"

_REQUIRED = ("peak_flops", "memory_bytes", "mem_bandwidth_bytes_s", "interconnect_bytes_s",
             "host_link_bytes_s")


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU's roofline: peak tensor FLOP/s, HBM bandwidth and capacity, links, price."""

    name: str
    peak_flops: float  # dense bf16/fp16 tensor-core FLOP/s, without 2:4 sparsity
    mem_bandwidth_bytes_s: float  # device memory bandwidth, bytes/s
    memory_bytes: int  # device memory capacity, bytes
    # GPU-to-GPU bandwidth of one GPU in one direction, bytes/s (NVLink, or PCIe where the
    # card has none). Datasheets quote the bidirectional total, so this is half of it.
    interconnect_bytes_s: float
    # Host (CPU memory) link of one GPU in one direction, bytes/s: PCIe (NVLink-C2C on a Grace
    # superchip), which KV swapped to host memory crosses. Datasheets quote the bidirectional
    # total, so this is half of it.
    host_link_bytes_s: float
    # GPUs that reach each other at interconnect_bytes_s (an HGX board, a PCIe server, a
    # GB200 NVL72 rack's NVLink domain); tensor parallelism stays within them.
    max_gpus: int = 8
    peak_fp8_flops: float | None = None  # dense FP8 tensor FLOP/s; None: no FP8 tensor cores
    # Fixed cost of one collective (all-reduce, all-to-all) on top of its bytes.
    interconnect_latency_s: float = 10e-6
    # One GPU's share of its node's network to other nodes, one direction, bytes/s (its
    # NIC: InfiniBand, RoCE), and the fixed cost of one hop over it; None where the file
    # gives none (a collective over more than max_gpus GPUs then cannot be priced).
    network_bytes_s: float | None = None
    network_latency_s: float | None = None
    usd_per_hour: float | None = None  # default price of one GPU for one hour, USD
    # Measured all-reduces (nccl-tests on this machine): (GPUs, latency_s, bus bytes/s), which
    # the fitted cost model takes instead of its generic curve scaled to the interconnect.
    allreduce: tuple[tuple[int, float, float], ...] = ()
    description: str = ""
    # Where each number comes from, by field name (as the file gives it).
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for key in ("peak_flops", "mem_bandwidth_bytes_s", "memory_bytes",
                    "interconnect_bytes_s", "host_link_bytes_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"hardware {self.name}: {key} must be > 0")
        if self.max_gpus < 1:
            raise ValueError(f"hardware {self.name}: max_gpus must be >= 1, got {self.max_gpus}")
        if self.peak_fp8_flops is not None and not self.peak_fp8_flops > 0:
            raise ValueError(f"hardware {self.name}: peak_flops.fp8 must be > 0")
        if not self.interconnect_latency_s >= 0:
            raise ValueError(f"hardware {self.name}: interconnect_latency_s must be >= 0")
        if (self.network_bytes_s is None) != (self.network_latency_s is None):
            raise ValueError(f"hardware {self.name}: network_bytes_s and network_latency_s "
                             "go together")
        if self.network_bytes_s is not None and not (
                self.network_bytes_s > 0 and self.network_latency_s >= 0):
            raise ValueError(f"hardware {self.name}: network_bytes_s must be > 0 and "
                             "network_latency_s >= 0")
        if self.usd_per_hour is not None and not self.usd_per_hour > 0:
            raise ValueError(f"hardware {self.name}: usd_per_hour must be > 0")
        for gpus, latency_s, bus_bytes_s in self.allreduce:
            if gpus < 2 or not latency_s >= 0 or not bus_bytes_s > 0:
                raise ValueError(f"hardware {self.name}: allreduce.{gpus} needs >= 2 GPUs, "
                                 f"latency_s >= 0 and bus_bytes_s > 0")

    def flops_for(self, dtype: str) -> float:
        """Peak dense FLOP/s of GEMMs in `dtype` (bf16, fp16 or fp8)."""
        if dtype != "fp8":
            return self.peak_flops
        if self.peak_fp8_flops is None:
            raise ValueError(f"hardware {self.name}: no FP8 tensor cores (peak_flops.fp8)")
        return self.peak_fp8_flops


def load_hardware(path: Path) -> HardwareSpec:
    """A HardwareSpec from a GPU file; errors name the file and the field."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read a GPU file: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a GPU file must be a JSON object")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise ValueError(f"{path}: GPU file lacks {', '.join(missing)}")
    flops = data["peak_flops"]
    if not isinstance(flops, dict) or "bf16" not in flops:
        raise ValueError(f"{path}: peak_flops must map dtypes to FLOP/s, bf16 at least")
    try:
        return HardwareSpec(
            name=str(data.get("name", Path(path).stem)), peak_flops=float(flops["bf16"]),
            mem_bandwidth_bytes_s=float(data["mem_bandwidth_bytes_s"]),
            memory_bytes=int(data["memory_bytes"]),
            interconnect_bytes_s=float(data["interconnect_bytes_s"]),
            host_link_bytes_s=float(data["host_link_bytes_s"]),
            max_gpus=int(data.get("max_gpus", 8)),
            peak_fp8_flops=None if flops.get("fp8") is None else float(flops["fp8"]),
            interconnect_latency_s=float(data.get("interconnect_latency_s", 10e-6)),
            network_bytes_s=_optional(data, "network_bytes_s"),
            network_latency_s=_optional(data, "network_latency_s"),
            usd_per_hour=None if data.get("usd_per_hour") is None
            else float(data["usd_per_hour"]),
            allreduce=_allreduce(data.get("allreduce") or {}),
            description=str(data.get("description", "")),
            sources=tuple(sorted((data.get("sources") or {}).items())),
        )
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: {error}") from None


def _optional(data: dict, key: str) -> float | None:
    return None if data.get(key) is None else float(data[key])


def _allreduce(table: object) -> tuple[tuple[int, float, float], ...]:
    """A GPU file's measured all-reduces: {"<GPUs>": {"latency_s": s, "bus_bytes_s": B/s}}."""
    if not isinstance(table, dict):
        raise ValueError("allreduce must map GPU counts to {latency_s, bus_bytes_s}")
    out = []
    for gpus, row in table.items():
        if not isinstance(row, dict) or {"latency_s", "bus_bytes_s"} - set(row):
            raise ValueError(f"allreduce.{gpus} must give latency_s and bus_bytes_s")
        try:
            out.append((int(gpus), float(row["latency_s"]), float(row["bus_bytes_s"])))
        except (TypeError, ValueError):
            raise ValueError(f"allreduce.{gpus}: GPU count and numbers expected") from None
    return tuple(sorted(out))


# The first presets, listed first; the other files follow by name.
_FIRST = ("a100-80gb", "h100", "h200")


@cache
def _shipped() -> dict[str, HardwareSpec]:
    specs = {spec.name: spec for spec in map(load_hardware, sorted(GPUS_DIR.glob("*.json")))}
    return dict(sorted(specs.items(), key=lambda item: (item[0] not in _FIRST, item[0])))


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())  # "RTX4090", "rtx_4090" -> "rtx4090"


HARDWARE_SPECS: dict[str, HardwareSpec] = _shipped()

# Default price of one GPU for one hour, USD, per preset (each file's usd_per_hour): for
# comparing configurations against each other, not a quote for any provider.
# `servelab plan --gpu-prices` overrides them.
GPU_HOUR_USD: dict[str, float] = {
    name: spec.usd_per_hour for name, spec in HARDWARE_SPECS.items()
    if spec.usd_per_hour is not None
}


def hardware_spec(name: str) -> HardwareSpec:
    """A shipped GPU by name (case and dashes ignored), or a GPU file's path."""
    for preset, spec in HARDWARE_SPECS.items():
        if _key(preset) == _key(name):
            return spec
    path = Path(name)
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise ValueError(f"--hardware {name}: no such GPU file")
        return load_hardware(path)
    known = ", ".join(HARDWARE_SPECS)
    raise ValueError(f"unknown hardware preset {name!r}; known: {known} (or a GPU file)")


def gpu_hour_usd(name: str, prices: dict[str, float] | None = None) -> float:
    """USD per GPU-hour of preset `name`: `prices` overrides GPU_HOUR_USD name by name."""
    table = GPU_HOUR_USD if prices is None else {**GPU_HOUR_USD, **prices}
    price = table.get(name)
    if price is None and name not in HARDWARE_SPECS and Path(name).is_file():
        price = load_hardware(Path(name)).usd_per_hour  # a GPU file's own price
    if price is None:
        known = ", ".join(table)
        raise ValueError(f"gpu_hour_usd: no price for GPU {name!r}; known: {known}") from None
    if not price > 0.0:
        raise ValueError(f"gpu_hour_usd: price of {name!r} must be > 0, got {price}")
    return price
