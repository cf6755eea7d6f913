"""The shared vocabulary: Request, SamplingParams, BatchPlan, StepResult, Backend.

Everything else in servelab (scheduler, simulator, executor, server) speaks these types.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class RequestStatus(enum.Enum):
    """Where a request is in its life; compare by identity, never by order."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # evicted by recompute: back in the waiting queue, KV freed
    FINISHED = "finished"


class FinishReason(enum.Enum):
    """Why a finished request stopped."""

    LENGTH = "length"  # produced max_new_tokens
    STOP = "stop"  # sampled EOS or a stop token id
    ABORTED = "aborted"  # cancelled by the caller (client disconnect, shutdown)
    REJECTED = "rejected"  # can never fit: prompt+max_new_tokens above the pool or max_model_len
    FAILED = "failed"  # the backend raised while computing a step that held this request


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling; temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    seed: int = 0  # seeds this request's own torch.Generator
    stop_token_ids: tuple[int, ...] = ()  # always end the request
    eos_token_id: int | None = None  # ends the request unless ignore_eos
    ignore_eos: bool = True  # traces fix the output length, as `vllm bench` does

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    def stops(self, token: int) -> bool:
        """Whether sampling `token` ends the request (a stop id, or EOS unless ignored)."""
        return token in self.stop_token_ids or (
            token == self.eos_token_id and not self.ignore_eos)


@dataclass(slots=True, eq=False)
class Request:
    """One generation, the same object from arrival to finish."""

    request_id: str
    arrival_s: float
    prompt_len: int
    max_new_tokens: int
    prompt_token_ids: list[int] | None = None  # None in pure simulation
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Trace prefix ids, one per PREFIX_BLOCK_TOKENS prompt tokens: equal ids, equal content.
    # Pure simulation keys its cached blocks by them; None: the prompt shares nothing.
    prefix_hash_ids: tuple[int, ...] | None = None
    # Tokens each prefix id covers (token-granular prefixes); None: PREFIX_BLOCK_TOKENS each.
    prefix_hash_tokens: tuple[int, ...] | None = None
    priority: int = 0  # lower is served first under --queue priority (vLLM's convention)
    tenant: str = ""  # who sent it: --queue fair shares service between tenants
    # Mutable state, owned by the Scheduler.
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    finish_detail: str = ""  # human-readable reason for rejected/failed requests
    num_computed_tokens: int = 0  # tokens (prompt + output) whose KV is in cache
    output_token_ids: list[int] = field(default_factory=list)  # filled by a real backend
    token_times_s: list[float] = field(default_factory=list)  # end of the step of each token
    first_scheduled_s: float | None = None
    finish_s: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    # Prompt tokens whose KV arrives from elsewhere (a prefill engine, under P/D
    # disaggregation): its next admission counts them computed, once.
    num_external_tokens: int = 0
    block_hashes: list = field(default_factory=list)  # content keys of its full KV blocks

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"request {self.request_id}: prompt_len must be >= 1")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_new_tokens must be >= 1")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_len:
            raise ValueError(f"request {self.request_id}: prompt_len != len(prompt_token_ids)")

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far (one timestamp each)."""
        return len(self.token_times_s)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: the length the KV cache must cover to go on."""
        return self.prompt_len + len(self.token_times_s)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def token_ids(self) -> list[int]:
        """Prompt then output token ids (a real backend only)."""
        assert self.prompt_token_ids is not None, "token ids exist only with a real backend"
        return self.prompt_token_ids + self.output_token_ids


@dataclass(slots=True)
class BatchPlan:
    """What one engine step computes, built by `Scheduler.schedule`."""

    # request_id -> tokens computed this step: a prefill chunk is n, a decode is 1.
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    # The scheduled requests, in the same order as num_scheduled_tokens.
    requests: list[Request] = field(default_factory=list)
    # Ids admitted from the waiting queue this step (their prefill starts now).
    admitted: list[str] = field(default_factory=list)
    # Ids evicted this step (KV freed, back to the front of the queue).
    preempted: list[str] = field(default_factory=list)
    # Static batching: finished rows computed as padding (one token each, no output).
    padding: list[Request] = field(default_factory=list)
    # --preemption swap: (request id, device blocks, host blocks) copied device -> host, then
    # (request id, host blocks, device blocks) copied host -> device, both before the forward.
    swap_out: list[tuple[str, list[int], list[int]]] = field(default_factory=list)
    swap_in: list[tuple[str, list[int], list[int]]] = field(default_factory=list)
    swap_tokens: int = 0  # tokens of KV those copies move (either way), for cost models
    # Derived totals for cost models, accumulated while the plan is built.
    prefill_tokens: int = 0  # tokens of prompt/recompute chunks (every non-decode token)
    prefill_attn: int = 0  # sum over prefill chunks of chunk_len * context_len after it
    # The (query, key) pairs causal attention visits: prefill_attn less each chunk's
    # upper triangle, chunk_len * (chunk_len - 1) / 2.
    prefill_attn_causal: int = 0
    prefill_seqs: int = 0  # sequences with a prefill chunk
    prefill_chunk_max: int = 0  # longest prefill chunk (padded executors pay for it per row)
    prefill_context_max: int = 0  # longest KV length a prefill chunk attends over
    decode_seqs: int = 0  # sequences decoding one token (padding rows included)
    num_sampled: int = 0  # rows that end their sequence and sample a token (logits rows)
    decode_context: int = 0  # sum of KV lengths read by decodes (padding rows included)
    decode_context_max: int = 0  # longest decode KV length
    # Speculative decoding: request_id -> proposed tokens the row verifies this step (its
    # num_scheduled_tokens is 1 + that: the last token and the proposals, one chunk), and
    # their ids where the proposer saw token ids (a real backend), else no entry.
    num_spec_tokens: dict[str, int] = field(default_factory=dict)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # Decodes counted in the totals above but not listed in requests (sim.engine.fast_forward: only
    # for a backend that prices a plan from its totals).
    unlisted_decodes: int = 0

    @property
    def num_tokens(self) -> int:
        """Tokens computed this step, padding rows included."""
        return self.prefill_tokens + self.decode_seqs

    @property
    def batch_size(self) -> int:
        """Rows in the forward, padding rows included."""
        return len(self.requests) + self.unlisted_decodes + len(self.padding)

    @property
    def is_empty(self) -> bool:
        """Nothing to compute and no KV to copy."""
        return (not self.requests and not self.unlisted_decodes and not self.padding
                and not self.swap_out)


@dataclass(slots=True)
class StepResult:
    """What a backend reports for one executed plan."""

    duration_s: float
    # request_id -> sampled token, for every request whose step completed its sequence
    # (finished its prompt or decoded). None from backends that sample nothing (simulation).
    sampled_token_ids: dict[str, int] | None = None
    # Speculative decoding, a real backend: request_id -> the tokens a verified row produced
    # (its accepted proposals, then the token sampled after them). None in simulation, where
    # the scheduler draws how many proposals are accepted.
    spec_token_ids: dict[str, list[int]] | None = None


class Backend(Protocol):
    """Runs (or predicts) one step: the cost model predicts, the executor measures."""

    def execute(self, plan: BatchPlan) -> StepResult: ...

    def free(self, request: Request) -> None:
        """Forget per-request state (e.g. a sampling generator) once a request leaves."""
        ...



# ---- optional capabilities: a backend has one when it has its member ----------------------


@runtime_checkable
class ReadsRows(Protocol):
    """`reads_rows = False`: execute needs only a plan's totals and samples no tokens, so the
    scheduler may leave decode rows out of the plan's lists (sim.engine.fast_forward). Default:
    True."""

    reads_rows: bool


@runtime_checkable
class PricesDecodeRuns(Protocol):
    """The durations execute would give a run of num_steps steps that only decode the same
    `rows` rows, of `context` KV tokens in all at the first (each step adds one per row):
    fast-forward runs (sim.engine.fast_forward_run) price them at once. Default: one execute per
    step."""

    def decode_steps_s(self, rows: int, context: int, num_steps: int) -> list[float]: ...


@runtime_checkable
class HasRequestOverhead(Protocol):
    """A server's own path from the socket to its scheduler, in seconds (a calibration from
    its URL measures it): the scheduler sees each request this much after it arrived.
    Default: 0."""

    request_overhead_s: float


@runtime_checkable
class HasRowKnots(Protocol):
    """Batch sizes (sampled rows) at which a decode step's cost steps up (the executor's
    kernels). Default: none."""

    row_knots: tuple[int, ...]


@runtime_checkable
class SchedulesAhead(Protocol):
    """An engine that schedules step n+1 while the GPU runs step n (vLLM's async
    scheduling): a request that reaches it during a step misses the step already scheduled
    and joins the one after (sim.engine.step.Engine.add). Default: False."""

    schedules_ahead: bool


def schedules_ahead(backend: Backend) -> bool:
    """Whether the backend's engine schedules one step ahead (SchedulesAhead)."""
    return backend.schedules_ahead if isinstance(backend, SchedulesAhead) else False


def reads_rows(backend: Backend) -> bool:
    """Whether the backend reads a plan's rows (ReadsRows)."""
    return backend.reads_rows if isinstance(backend, ReadsRows) else True


def request_overhead_s(backend: Backend) -> float:
    """The backend's request overhead in seconds (HasRequestOverhead)."""
    return backend.request_overhead_s if isinstance(backend, HasRequestOverhead) else 0.0


def row_knots(backend: Backend) -> tuple[int, ...]:
    """The backend's row knots (HasRowKnots)."""
    return backend.row_knots if isinstance(backend, HasRowKnots) else ()


# Per-token seeds: a request's random stream depends only on its seed and the token index,
# the same rule for the executor's sampler and the simulated server's draws.
_MASK64 = (1 << 64) - 1


def token_seed(seed: int, index: int) -> int:
    """A well-mixed 63-bit seed for output token `index` of a request seeded `seed`."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xD1B54A32D192ED03) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64  # splitmix64 finalizer
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1
