"""SchedulerConfig: the policy and limits of one scheduler (`--policy` and its flags)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from sim.engine.batching import (
    BatchingPolicy,
    ChunkedBatching,
    ContinuousBatching,
    RecomputeBatching,
)
from sim.engine.eviction import EVICTIONS
from sim.engine.queues import QUEUES
from sim.engine.speculation.config import SpeculativeConfig
from sim.engine.static_padding import StaticBatching
from sim.specs.engine_limits import ENGINE_DEFAULTS

# The batching policies by `--policy` name: a new policy is a class and a line here.
BATCHING: dict[str, type[BatchingPolicy]] = {
    "static": StaticBatching,
    "continuous": ContinuousBatching,
    "recompute": RecomputeBatching,
    "chunked": ChunkedBatching,
}

POLICIES = tuple(BATCHING)  # static, continuous, recompute, chunked
DEFAULT_POLICY = "continuous"  # what every command runs when no --policy is given
# What a vLLM deployment runs when no --policy is given: vLLM V1 always chunks prefills.
VLLM_POLICY = "chunked"
PREEMPTION_MODES = tuple(EVICTIONS)  # recompute, swap
DEFAULT_QUEUE_AGING_S = 60.0  # the starvation bound of priority and sjf unless one is given


@dataclass(frozen=True)
class SchedulerConfig:
    """Policy and limits of one scheduler (`--policy` and the scheduler flags)."""

    policy: str = DEFAULT_POLICY
    num_blocks: int = 4096  # KV pool size in blocks
    block_size: int = ENGINE_DEFAULTS.block_size  # tokens per KV block
    max_num_seqs: int = ENGINE_DEFAULTS.max_num_seqs  # most requests running at once
    max_model_len: int = ENGINE_DEFAULTS.max_model_len  # prompt + output one request may reach
    # Most tokens one step computes (vLLM's max_num_batched_tokens). None: the default budget
    # (ENGINE_DEFAULTS) for chunked, else max_model_len (without chunking a whole prompt must
    # fit one step). `static` prefills its whole batch in one
    # step and is bounded by max_num_seqs and KV instead.
    token_budget: int | None = None
    # Share full KV blocks by content (vLLM's automatic prefix caching, on by default there).
    enable_prefix_caching: bool = True
    # Who is admitted first (sim.engine.queues): fcfs, priority, fair or sjf. Under `priority` a
    # waiting request may also preempt a running one of lower priority.
    queue: str = "fcfs"
    # Starvation bound of the non-FCFS orders: once a request has waited this long, no
    # request that arrived after it is admitted before it. None: DEFAULT_QUEUE_AGING_S for
    # priority and sjf, none for fair, whose counters already bound how far one backlogged
    # tenant falls behind another (an arrival-order bound there would turn it back into FCFS
    # under sustained overload, which is when a light tenant needs it).
    queue_aging_s: float | None = None
    sjf_noise: float = 0.0  # log-space std of sjf's output-length prediction (0: oracle)
    # What eviction does with a victim's KV: drop it and recompute later, or copy it to a
    # host pool of swap_space_blocks blocks and back (recompute when the pool is full).
    preemption: str = "recompute"
    swap_space_blocks: int = 0
    # Speculative decoding (`--speculative-config`); None: off.
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        self._check_parts()
        for key in ("num_blocks", "block_size", "max_num_seqs", "max_model_len"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        self._check_budget()

    def _check_parts(self) -> None:
        """The policy, queue and eviction named exist, with settings they accept."""
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose from {', '.join(POLICIES)}")
        if self.queue not in QUEUES:
            raise ValueError(f"unknown queue {self.queue!r}; choose from {', '.join(QUEUES)}")
        if self.queue_aging_s is not None and not self.queue_aging_s > 0:
            raise ValueError(f"queue_aging_s must be > 0, got {self.queue_aging_s}")
        if not self.sjf_noise >= 0:
            raise ValueError(f"sjf_noise must be >= 0, got {self.sjf_noise}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"unknown preemption {self.preemption!r}; choose from "
                             f"{', '.join(PREEMPTION_MODES)}")
        if self.preemption == "swap" and self.swap_space_blocks < 1:
            raise ValueError("preemption by swap needs a host pool: swap_space_blocks >= 1")
        if self.speculative is not None and self.policy == "static":
            raise ValueError("speculative decoding needs an iteration-level policy, not static")

    def _check_budget(self) -> None:
        """A given token budget lets every running request decode each step and, where
        prompts are not split, holds a whole prompt."""
        if self.token_budget is not None:
            if self.token_budget < 1:
                raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")
            batching = BATCHING[self.policy]
            if batching.budgeted and self.token_budget < self.max_num_seqs:
                raise ValueError(
                    f"token_budget {self.token_budget} < max_num_seqs {self.max_num_seqs}: "
                    "every running request must be able to decode each step"
                )
            whole_prompts = batching.budgeted and not batching.splits_prompts
            if whole_prompts and self.token_budget < self.max_model_len:
                raise ValueError(
                    f"token_budget {self.token_budget} < max_model_len {self.max_model_len}: "
                    f"policy {self.policy} prefills whole prompts, use chunked to split them"
                )

    def never_fits(self, num_tokens: int) -> str:
        """Why a request of num_tokens (prompt + max_new_tokens) can never run; '' if it can."""
        if num_tokens > self.max_model_len:
            return (f"prompt+max_new_tokens={num_tokens} exceeds "
                    f"max_model_len={self.max_model_len}")
        blocks = -(-num_tokens // self.block_size)
        if blocks > self.num_blocks:
            return f"needs {blocks} KV blocks, the pool has {self.num_blocks}"
        return ""

    @property
    def budget(self) -> int:
        """The resolved per-step token budget."""
        if self.token_budget is not None:
            return self.token_budget
        if BATCHING[self.policy].splits_prompts:
            return ENGINE_DEFAULTS.token_budget
        return self.max_model_len

    @property
    def reserves_full(self) -> bool:
        """Admission reserves prompt + max_new_tokens up front (slot-like KV)."""
        return BATCHING[self.policy].reserves_full

    @property
    def num_host_blocks(self) -> int:
        """The host pool swapped-out KV may use: swap_space_blocks under swap, else none."""
        return self.swap_space_blocks if self.preemption == "swap" else 0

    @property
    def aging_s(self) -> float:
        """The starvation bound in force (queue_aging_s, or the queue's own default)."""
        if self.queue_aging_s is not None:
            return self.queue_aging_s
        return math.inf if self.queue == "fair" else DEFAULT_QUEUE_AGING_S

    def as_record(self) -> dict[str, object]:
        """The config as `--json` records it: the token budget and aging bound in force (an
        unbounded one as null)."""
        aging_s = self.aging_s
        record = {**asdict(self), "token_budget": self.budget,
                  "queue_aging_s": aging_s if math.isfinite(aging_s) else None}
        if self.speculative is None:  # (records without speculation stay as they were)
            del record["speculative"]
        return record
