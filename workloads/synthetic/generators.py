"""The synthetic trace spec and its draw: arrivals, then lengths, for one tenant or several
merged. All randomness comes from the `numpy.random.Generator`s the caller passes."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from workloads.sessions import SessionSpec
from workloads.synthetic.arrivals import Stage, gamma_arrivals_s, poisson_arrivals_s
from workloads.synthetic.lengths import Empirical, LengthDist
from workloads.synthetic.shapes import generate_shaped
from workloads.trace import Trace

TENANT_NAME = re.compile(r"[A-Za-z0-9_-]+")  # no ',' ';' '=' or spaces: it sits in a spec
_INT64 = (-(2**63), 2**63 - 1)  # the trace's priority column is int64


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic trace: `num_requests` arrivals at `rate_per_s` with length distributions.

    The shapes (workloads.synthetic.shapes) add: shared system prompts (`system_tokens` tokens,
    one of `groups` per request; with `prompts_per_group`, groups x prompts distinct prompts
    that the requests cycle through), load `stages` instead of n and rate, and `session`s
    (multi-turn conversations). With `question`, `prompt` draws the part after the system prompt.
    """

    num_requests: int | None
    rate_per_s: float | None
    prompt: LengthDist
    output: LengthDist
    arrival: str = "poisson"  # "poisson", "gamma" or "constant" (even gaps)
    cv: float = 1.0  # gamma inter-arrival coefficient of variation; > 1 is bursty
    tenant: str | None = None  # None: no tenant column, ids "0", "1", ...
    priority: int | None = None  # lower is served first (vLLM); None: no priority column
    system_tokens: int = 0  # a shared system prompt leads every prompt; 0: none
    groups: int = 1  # distinct system prompts
    prompts_per_group: int | None = None  # distinct questions per group; None: all own
    question: bool = False  # prompt draws the question after the system prompt
    stages: tuple[Stage, ...] = ()  # load stages; replace n and rate
    session: SessionSpec | None = None  # multi-turn users
    max_model_len: int | None = None  # chat truncation: oldest turns dropped to fit

    def __post_init__(self) -> None:
        if self.stages or self.session is not None:
            self._check_shaped()
        else:
            if self.num_requests is None or self.num_requests < 1:
                raise ValueError(f"n must be >= 1, got {self.num_requests}")
            if self.rate_per_s is None or not self.rate_per_s > 0:
                raise ValueError(f"rate must be > 0, got {self.rate_per_s}")
        if self.arrival not in ("poisson", "gamma", "constant"):
            raise ValueError(f"arrival must be poisson, gamma or constant, got {self.arrival!r}")
        if not self.cv > 0:
            raise ValueError(f"cv must be > 0, got {self.cv}")
        if self.tenant is not None and not TENANT_NAME.fullmatch(self.tenant):
            raise ValueError(f"tenant={self.tenant!r}: use letters, digits, '-' and '_' only")
        if self.priority is not None and not _INT64[0] <= self.priority <= _INT64[1]:
            raise ValueError(f"priority={self.priority} does not fit in 64 bits")
        self._check_prefix()

    def _check_shaped(self) -> None:
        """Stages replace n and rate; a session needs users and a session-start rate."""
        if self.stages and (self.num_requests is not None or self.rate_per_s is not None):
            raise ValueError("stages= replaces n= and rate=; give one or the other")
        kinds = {stage.kind for stage in self.stages}
        if "concurrency" in kinds and len(self.stages) > 1:
            raise ValueError(
                "a concurrency stage must be the only stage (its duration is an outcome)"
            )
        if self.session is not None:
            if self.stages or self.num_requests is not None:
                raise ValueError("users= sessions start at rate=; stages= and n= do not apply")
            if self.rate_per_s is None or not self.rate_per_s > 0:
                raise ValueError("users= needs rate=R (sessions started per second)")

    def _check_prefix(self) -> None:
        if self.system_tokens < 0:
            raise ValueError(f"system must be >= 0 tokens, got {self.system_tokens}")
        if self.groups < 1:
            raise ValueError(f"groups must be >= 1, got {self.groups}")
        if self.prompts_per_group is not None and self.prompts_per_group < 1:
            raise ValueError(f"prompts must be >= 1, got {self.prompts_per_group}")
        if self.max_model_len is not None and self.max_model_len <= self.system_tokens + 1:
            raise ValueError(
                f"max_len={self.max_model_len} leaves no room after system={self.system_tokens}"
            )

    @property
    def is_shaped(self) -> bool:
        """Whether it needs workloads.synthetic.shapes: prefixes, stages, sessions or even gaps."""
        return bool(
            self.system_tokens or self.prompts_per_group or self.stages or self.session
            or self.question or self.arrival == "constant" or self.max_model_len
        )


def generate_trace(spec: SyntheticSpec, rng: np.random.Generator, name: str = "synthetic") -> Trace:
    """Draw a trace: arrivals first, then prompt and output lengths, all from `rng`."""
    if spec.is_shaped:
        return generate_shaped(spec, rng, name)
    count = spec.num_requests
    if spec.arrival == "gamma":
        arrival_s = gamma_arrivals_s(count, spec.rate_per_s, spec.cv, rng)
    else:
        arrival_s = poisson_arrivals_s(count, spec.rate_per_s, rng)
    prompt, output = spec.prompt, spec.output
    if (
        isinstance(prompt, Empirical)
        and isinstance(output, Empirical)
        and (prompt.trace is output.trace)
    ):
        # Same source for both: resample whole rows so prompt/output correlation is kept.
        rows = rng.integers(0, len(prompt.trace), count)
        prompt_len = prompt.trace.table[prompt.column].to_numpy()[rows]
        output_len = output.trace.table[output.column].to_numpy()[rows]
    else:
        prompt_len = prompt.sample(count, rng)
        output_len = output.sample(count, rng)
    tenant = None if spec.tenant is None else [spec.tenant] * count
    ids = None if spec.tenant is None else [f"{spec.tenant}-{i}" for i in range(count)]
    priority = None if spec.priority is None else np.full(count, spec.priority)
    return Trace.from_arrays(
        name, arrival_s, prompt_len, output_len, ids, tenant=tenant, priority=priority
    )


def part_rngs(seed: int, count: int) -> list[np.random.Generator]:
    """One Generator per spec part: a lone part draws from `seed` itself (as before parts
    existed); part i of several from child i of SeedSequence(seed)."""
    if count == 1:
        return [np.random.default_rng(seed)]
    # Child i depends only on (seed, i), so adding a part leaves the others' draws unchanged.
    return [
        np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(i,))) for i in range(count)
    ]


def generate_parts(
    parts: Sequence[SyntheticSpec], rngs: Sequence[np.random.Generator], name: str = "synthetic"
) -> Trace:
    """Draw each part with its own Generator and merge the arrivals (stable sort by time)."""
    if len(parts) != len(rngs) or not parts:
        raise ValueError(
            f"need one Generator per part, got {len(parts)} parts and {len(rngs)} Generators"
        )
    if len(parts) == 1:
        return generate_trace(parts[0], rngs[0], name)
    tenants = [part.tenant for part in parts]
    if None in tenants or len(set(tenants)) != len(tenants):
        raise ValueError(f"several parts need unique tenant names, got {tenants}")
    if any(part.priority is not None for part in parts):  # a part without priority= is 0
        parts = [replace(part, priority=part.priority or 0) for part in parts]
    tables = [generate_trace(part, rng, name).table for part, rng in zip(parts, rngs, strict=True)]
    # A part without shared prefixes (no system=) shares none: empty lists, not missing cells.
    listed = [c for c in ("prefix_hash_ids", "prefix_hash_tokens") if any(c in t for t in tables)]
    tables = [t.assign(**{c: pd.Series([[] for _ in range(len(t))], dtype=object)
                          for c in listed if c not in t}) for t in tables]
    merged = pd.concat(tables, ignore_index=True)
    # Stable: at equal times (every part's first arrival is 0) part order decides.
    merged = merged.sort_values("arrival_s", kind="stable", ignore_index=True)
    return Trace(name, merged)
