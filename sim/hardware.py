"""GPU presets for the analytic cost model: peak dense FLOP/s, memory bandwidth, memory size.

Numbers are the vendor's datasheet figures for one SXM GPU; the cost model's efficiency
factors, not these presets, account for what real kernels achieve.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU's roofline: peak tensor FLOP/s, HBM bandwidth and HBM capacity."""

    name: str
    peak_flops: float  # dense bf16/fp16 tensor-core FLOP/s, without 2:4 sparsity
    mem_bandwidth_bytes_s: float  # HBM bandwidth, bytes/s
    memory_bytes: int  # HBM capacity, bytes

    def __post_init__(self) -> None:
        for key in ("peak_flops", "mem_bandwidth_bytes_s", "memory_bytes"):
            if not getattr(self, key) > 0:
                raise ValueError(f"hardware {self.name}: {key} must be > 0")


# Datasheets quote memory as "80GB"/"141GB"; nvidia-smi reports 81920 MiB (A100 80GB),
# 81559 MiB (H100 SXM) and 143771 MiB (H200), so the figure is read as GiB (within 1%).
HARDWARE_SPECS: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        # NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column:
        # BF16 tensor 312 TFLOPS dense (624 with sparsity), HBM2e 2,039 GB/s, 80 GB.
        HardwareSpec("a100-80gb", 312e12, 2039e9, 80 * GiB),
        # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column:
        # BF16 tensor 1,979 TFLOPS with sparsity, so 989 dense; HBM3 3.35 TB/s; 80 GB.
        HardwareSpec("h100", 989e12, 3.35e12, 80 * GiB),
        # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column:
        # BF16 tensor 1,979 TFLOPS with sparsity, so 989 dense; HBM3e 4.8 TB/s; 141 GB.
        HardwareSpec("h200", 989e12, 4.8e12, 141 * GiB),
    )
}


def hardware_spec(name: str) -> HardwareSpec:
    """Look up a GPU preset by name, with the list of known names in the error."""
    try:
        return HARDWARE_SPECS[name]
    except KeyError:
        known = ", ".join(HARDWARE_SPECS)
        raise ValueError(f"unknown hardware preset {name!r}; known: {known}") from None
