"""vLLM's all-reduce as it dispatches one: its custom all-reduce below a size limit that
depends on the GPU and the GPU count, NCCL above (sim.cost.kernel_tables reads both
measured curves)."""

from __future__ import annotations

from dataclasses import dataclass

from sim.cost.kernel_curves import Curve

MiB = 2**20
# vLLM's custom all-reduce runs below 8 MiB; with symmetric memory (on by default on Hopper
# and Blackwell) its limit is the smaller of that and vllm/distributed/device_communicators/
# all_reduce_utils.py's CUSTOM_ALL_REDUCE_MAX_SIZES by compute capability and GPUs. Above
# it vLLM uses symmetric-memory or NCCL all-reduces, priced here by NCCL's table.
CUSTOM_AR_DEFAULT_MAX_BYTES = 8 * MiB
CUSTOM_AR_MAX_BYTES = {
    "h100": {2: 8 * MiB, 4: 8 * MiB, 6: MiB // 2, 8: MiB // 4},  # sm 9.0
    "h200": {2: 8 * MiB, 4: 8 * MiB, 6: MiB // 2, 8: MiB // 4},
    "b200": {2: 2 * MiB, 4: 2 * MiB, 6: MiB, 8: MiB},  # sm 10.0
}
# GPUs without NVLink: vLLM's custom all-reduce runs on two of them only (P2P over PCIe).
PCIE_ONLY = frozenset({"l40s", "rtx-pro-6000"})


def custom_max_bytes(gpu: str, num_gpus: int) -> float:
    """Largest message vLLM's custom all-reduce takes on `num_gpus` of `gpu` (0: never)."""
    if gpu in PCIE_ONLY and num_gpus > 2:
        return 0
    return CUSTOM_AR_MAX_BYTES.get(gpu, {}).get(num_gpus, CUSTOM_AR_DEFAULT_MAX_BYTES)


@dataclass(frozen=True)
class AllReduce:
    """One all-reduce's latency (ms) by message bytes, as vLLM dispatches it."""

    custom: Curve | None  # vLLM's custom all-reduce in a CUDA graph
    nccl: Curve | None
    custom_max_bytes: float  # messages below this go to the custom one

    def __call__(self, message_bytes: float) -> float:
        if self.custom is not None and message_bytes < self.custom_max_bytes:
            return self.custom(message_bytes)
        return self.nccl(message_bytes)
