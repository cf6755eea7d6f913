"""How a cluster is laid out: replicas behind a router, or prefill and decode pools."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.cluster.router import RouterConfig

# A 400 Gb/s NIC (ConnectX-7 / InfiniBand NDR), the default KV link of a prefill engine.
DEFAULT_KV_LINK_GBPS = 400.0


@dataclass(frozen=True)
class ClusterConfig:
    """How many engines, in which roles, behind which router."""

    num_replicas: int = 1  # engines serving whole requests (co-located prefill and decode)
    router: RouterConfig = field(default_factory=RouterConfig)
    # Prefill/decode disaggregation: num_prefill prefill engines and num_decode decode
    # engines instead of num_replicas co-located ones (both 0: co-located).
    num_prefill: int = 0
    num_decode: int = 0
    kv_link_gbps: float = DEFAULT_KV_LINK_GBPS  # each prefill engine's link, Gb/s
    kv_bytes_per_token: int = 0  # the model's K and V bytes per token (whole model)

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.num_replicas}")
        if (self.num_prefill > 0) != (self.num_decode > 0) or min(
                self.num_prefill, self.num_decode) < 0:
            raise ValueError(f"P/D needs >= 1 prefill and >= 1 decode engine, got "
                             f"{self.num_prefill}:{self.num_decode}")
        if not self.kv_link_gbps > 0:
            raise ValueError(f"kv link must be > 0 Gb/s, got {self.kv_link_gbps}")
        if self.kv_bytes_per_token < 0:
            raise ValueError("kv_bytes_per_token must be >= 0")

    @property
    def disaggregated(self) -> bool:
        return self.num_prefill > 0

    @property
    def num_engines(self) -> int:
        return self.num_prefill + self.num_decode if self.disaggregated else self.num_replicas

    def roles(self) -> list[str]:
        """Each engine's role, by index: 'mixed', or 'prefill' then 'decode'."""
        if not self.disaggregated:
            return ["mixed"] * self.num_replicas
        return ["prefill"] * self.num_prefill + ["decode"] * self.num_decode

    def transfer_s(self, num_tokens: int) -> float:
        """Seconds to move num_tokens tokens of KV over one prefill engine's link."""
        return num_tokens * self.kv_bytes_per_token * 8 / (self.kv_link_gbps * 1e9)
