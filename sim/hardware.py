"""GPU presets for the analytic cost model: peak dense FLOP/s, memory, NVLink, and prices.

Numbers are the vendor's datasheet figures for one SXM GPU; the cost model's efficiency
factors, not these presets, account for what real kernels achieve.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU's roofline: peak tensor FLOP/s, HBM bandwidth and capacity, NVLink bandwidth."""

    name: str
    peak_flops: float  # dense bf16/fp16 tensor-core FLOP/s, without 2:4 sparsity
    mem_bandwidth_bytes_s: float  # HBM bandwidth, bytes/s
    memory_bytes: int  # HBM capacity, bytes
    # GPU-to-GPU NVLink bandwidth of one GPU in one direction, bytes/s. Datasheets quote the
    # bidirectional total, so this is half the datasheet figure.
    interconnect_bytes_s: float
    # Host (CPU memory) link of one GPU in one direction, bytes/s: PCIe, which KV swapped to
    # host memory crosses. Datasheets quote the bidirectional total, so this is half of it.
    host_link_bytes_s: float
    # GPUs in one NVLink node (HGX board); tensor parallelism stays within one node.
    max_gpus: int = 8

    def __post_init__(self) -> None:
        for key in ("peak_flops", "mem_bandwidth_bytes_s", "memory_bytes",
                    "interconnect_bytes_s", "host_link_bytes_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"hardware {self.name}: {key} must be > 0")
        if self.max_gpus < 1:
            raise ValueError(f"hardware {self.name}: max_gpus must be >= 1, got {self.max_gpus}")


# Datasheets quote memory as "80GB"/"141GB"; nvidia-smi reports 81920 MiB (A100 80GB),
# 81559 MiB (H100 SXM) and 143771 MiB (H200), so the figure is read as GiB (within 1%).
HARDWARE_SPECS: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        # NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column:
        # BF16 tensor 312 TFLOPS dense (624 with sparsity), HBM2e 2,039 GB/s, 80 GB;
        # NVLink 600 GB/s (bidirectional), so 300 GB/s each way; HGX A100 holds 8 GPUs;
        # PCIe Gen4 x16, 64 GB/s (bidirectional), so 32 GB/s each way.
        HardwareSpec("a100-80gb", 312e12, 2039e9, 80 * GiB, 300e9, 32e9),
        # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column:
        # BF16 tensor 1,979 TFLOPS with sparsity, so 989 dense; HBM3 3.35 TB/s; 80 GB;
        # NVLink 900 GB/s (bidirectional), so 450 GB/s each way; HGX H100 holds 8 GPUs;
        # PCIe Gen5 x16, 128 GB/s (bidirectional), so 64 GB/s each way.
        HardwareSpec("h100", 989e12, 3.35e12, 80 * GiB, 450e9, 64e9),
        # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column:
        # BF16 tensor 1,979 TFLOPS with sparsity, so 989 dense; HBM3e 4.8 TB/s; 141 GB;
        # NVLink 900 GB/s (bidirectional), so 450 GB/s each way; HGX H200 holds 8 GPUs;
        # PCIe Gen5 x16, 128 GB/s (bidirectional), so 64 GB/s each way.
        HardwareSpec("h200", 989e12, 4.8e12, 141 * GiB, 450e9, 64e9),
    )
}

# Default price of one GPU for one hour, USD, per preset. Round numbers within the range of
# 2025 public-cloud on-demand list prices, which differ several-fold between providers:
# defaults for comparing configurations against each other, not a quote for any provider.
# `servelab plan --gpu-prices` overrides them.
GPU_HOUR_USD: dict[str, float] = {
    "a100-80gb": 2.0,
    "h100": 3.0,
    "h200": 4.0,
}


def hardware_spec(name: str) -> HardwareSpec:
    """Look up a GPU preset by name, with the list of known names in the error."""
    try:
        return HARDWARE_SPECS[name]
    except KeyError:
        known = ", ".join(HARDWARE_SPECS)
        raise ValueError(f"unknown hardware preset {name!r}; known: {known}") from None


def gpu_hour_usd(name: str, prices: dict[str, float] | None = None) -> float:
    """USD per GPU-hour of preset `name`: `prices` overrides GPU_HOUR_USD name by name."""
    table = GPU_HOUR_USD if prices is None else {**GPU_HOUR_USD, **prices}
    try:
        price = table[name]
    except KeyError:
        known = ", ".join(table)
        raise ValueError(f"gpu_hour_usd: no price for GPU {name!r}; known: {known}") from None
    if not price > 0.0:
        raise ValueError(f"gpu_hour_usd: price of {name!r} must be > 0, got {price}")
    return price
