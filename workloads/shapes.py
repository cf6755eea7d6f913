"""Workload shapes on top of the synthetic spec: load stages, shared system prompts (as
inference-perf's shared_prefix) and multi-turn sessions, with token-granular prefix segments
so the prefix cache sees exactly what the requests share."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from workloads.generators import (
    LengthDist,
    SyntheticSpec,
    gamma_arrivals_s,
    poisson_arrivals_s,
)
from workloads.sessions import SessionSpec, session_rows
from workloads.trace import SessionColumns, Trace

STAGE_KINDS = ("rate", "concurrency")


@dataclass(frozen=True)
class Stage:
    """One load stage: `rate` requests/s for `duration_s`, or `concurrency` users that each
    send the next request when the previous one finished, `count` requests in all."""

    kind: str  # "rate" or "concurrency"
    value: float  # requests/s, or the number of users
    duration_s: float = 0.0  # rate stages only
    count: int = 0  # concurrency stages only: requests in the stage

    def __post_init__(self) -> None:
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"stage kind must be rate or concurrency, got {self.kind!r}")
        if not self.value > 0:
            raise ValueError(f"{self.kind}({self.value:g}, ...): must be > 0")
        if self.kind == "rate" and not self.duration_s > 0:
            raise ValueError(f"rate({self.value:g}, {self.duration_s:g}): duration must be > 0")
        if self.kind == "concurrency" and (self.count < 1 or self.value != int(self.value)):
            raise ValueError(
                f"concurrency({self.value:g}, {self.count}): need whole users and count >= 1"
            )


def check_shaped(spec: SyntheticSpec) -> None:
    """Stages replace n and rate; a session needs users and a session-start rate."""
    if spec.stages and (spec.num_requests is not None or spec.rate_per_s is not None):
        raise ValueError("stages= replaces n= and rate=; give one or the other")
    kinds = {stage.kind for stage in spec.stages}
    if "concurrency" in kinds and len(spec.stages) > 1:
        raise ValueError("a concurrency stage must be the only stage (its duration is an outcome)")
    if spec.session is not None:
        if spec.stages or spec.num_requests is not None:
            raise ValueError("users= sessions start at rate=; stages= and n= do not apply")
        if spec.rate_per_s is None or not spec.rate_per_s > 0:
            raise ValueError("users= needs rate=R (sessions started per second)")


def stage_arrivals_s(
    stages: tuple[Stage, ...], arrival: str, cv: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival times of rate stages back to back, each drawn over its own duration."""
    times, start_s = [], 0.0
    for stage in stages:
        times.append(start_s + _arrivals_within(stage, arrival, cv, rng))
        start_s += stage.duration_s
    return np.concatenate(times)


def _arrivals_within(stage: Stage, arrival: str, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Arrivals in [0, duration): even gaps (rate x duration of them) or drawn gaps."""
    if arrival == "constant":
        return np.arange(int(round(stage.value * stage.duration_s))) / stage.value
    mean = stage.value * stage.duration_s
    count = max(16, int(mean + 10 * np.sqrt(mean) + 16))  # enough gaps to pass the end
    while True:
        if arrival == "gamma":
            drawn = gamma_arrivals_s(count, stage.value, cv, rng)
        else:
            drawn = poisson_arrivals_s(count, stage.value, rng)
        if drawn[-1] >= stage.duration_s:
            return drawn[drawn < stage.duration_s]
        count *= 2


def open_loop_arrivals_s(
    count: int, rate_per_s: float, arrival: str, cv: float, rng: np.random.Generator
) -> np.ndarray:
    """`count` arrivals at `rate_per_s`: even gaps, Poisson or gamma."""
    if arrival == "constant":
        return np.arange(count) / rate_per_s
    if arrival == "gamma":
        return gamma_arrivals_s(count, rate_per_s, cv, rng)
    return poisson_arrivals_s(count, rate_per_s, rng)


class SegmentIds:
    """Fresh prefix hash ids, unique within a trace (a tenant's part gets its own range)."""

    def __init__(self, tenant: str | None) -> None:
        self._next = (zlib.crc32((tenant or "").encode()) << 32) + 1

    def take(self, count: int) -> np.ndarray:
        ids = np.arange(self._next, self._next + count, dtype=np.int64)
        self._next += count
        return ids


def generate_shaped(spec: SyntheticSpec, rng: np.random.Generator, name: str) -> Trace:
    """Draw a shaped trace: sessions, or single requests with shared system prompts."""
    if spec.session is not None:
        return _sessions_trace(spec, rng, name)
    sessions = None
    if spec.stages and spec.stages[0].kind == "concurrency":
        stage = spec.stages[0]
        users = int(stage.value)
        arrival_s = np.zeros(stage.count)  # all ready at once; the users pace them
        turn = np.arange(stage.count) // users
        sessions = SessionColumns(
            [f"user-{i % users}" for i in range(stage.count)], turn, np.zeros(stage.count)
        )
    elif spec.stages:
        arrival_s = stage_arrivals_s(spec.stages, spec.arrival, spec.cv, rng)
    else:
        arrival_s = open_loop_arrivals_s(
            spec.num_requests, spec.rate_per_s, spec.arrival, spec.cv, rng
        )
    count = len(arrival_s)
    if count == 0:
        raise ValueError("stages= draws no request at all; raise a rate or a duration")
    prompt_len, output_len, ids, tokens = _prompts(spec, count, rng)
    return _build(spec, name, arrival_s, prompt_len, output_len, ids, tokens, sessions)


def _prompts(spec: SyntheticSpec, count: int, rng: np.random.Generator):
    """Prompt and output lengths with each request's prefix segments (ids, tokens)."""
    segment_ids = SegmentIds(spec.tenant)
    system_ids = segment_ids.take(spec.groups)
    if spec.prompts_per_group is not None:  # inference-perf: G x P prompts, cycled through
        distinct = spec.groups * spec.prompts_per_group
        question, output = spec.prompt.sample(distinct, rng), spec.output.sample(distinct, rng)
        group = np.arange(distinct) // spec.prompts_per_group
        question_ids = segment_ids.take(distinct)
        order = rng.permutation(distinct)[np.arange(count) % distinct]
        group, question, output = group[order], question[order], output[order]
        question_ids = question_ids[order]
    else:
        group = rng.integers(0, spec.groups, count)
        question, output = spec.prompt.sample(count, rng), spec.output.sample(count, rng)
        question_ids = None
    prompt_len = _prompt_lengths(spec, question)
    ids, tokens = [], []
    for i in range(count):
        row_ids = [int(system_ids[group[i]])] if spec.system_tokens else []
        row_tokens = [spec.system_tokens] if spec.system_tokens else []
        if question_ids is not None:  # the whole prompt repeats: its question is shared too
            row_ids.append(int(question_ids[i]))
            row_tokens.append(int(prompt_len[i] - spec.system_tokens))
        ids.append(row_ids)
        tokens.append(row_tokens)
    return prompt_len, output, ids, tokens


def _prompt_lengths(spec: SyntheticSpec, drawn: np.ndarray) -> np.ndarray:
    """Whole prompt lengths: system + question, or the drawn prompt (longer than system)."""
    if spec.question:
        prompt_len = drawn + spec.system_tokens
    else:
        short = drawn <= spec.system_tokens
        if short.any():
            row = int(np.argmax(short))
            raise ValueError(
                f"system={spec.system_tokens}: the shared prefix is longer than the prompt "
                f"(prompt= drew {int(drawn[row])} tokens for request {row}); use question= "
                "for the part after the system prompt"
            )
        prompt_len = drawn
    if spec.max_model_len is not None:
        prompt_len = np.minimum(prompt_len, spec.max_model_len - 1)
    return prompt_len


def _sessions_trace(spec: SyntheticSpec, rng: np.random.Generator, name: str) -> Trace:
    """Multi-turn users: each session starts at an open-loop arrival, turns follow."""
    session: SessionSpec = spec.session
    starts_s = open_loop_arrivals_s(session.users, spec.rate_per_s, spec.arrival, spec.cv, rng)
    segment_ids = SegmentIds(spec.tenant)
    system_ids = segment_ids.take(spec.groups)
    groups = rng.integers(0, spec.groups, session.users)
    system = [
        [(int(system_ids[g]), spec.system_tokens)] if spec.system_tokens else [] for g in groups
    ]
    rows = session_rows(session, starts_s, system, spec.prompt, spec.output, spec.max_model_len,
                        segment_ids.take, rng)
    order = np.argsort(rows.arrival_s, kind="stable")
    pick = order.tolist()
    sessions = SessionColumns(
        [rows.session_id[i] for i in pick], rows.turn[order], rows.think_s[order]
    )
    return _build(spec, name, rows.arrival_s[order], rows.prompt_len[order],
                  rows.output_len[order], [rows.ids[i] for i in pick],
                  [rows.tokens[i] for i in pick], sessions)


def _build(spec: SyntheticSpec, name: str, arrival_s, prompt_len, output_len, ids, tokens,
           sessions: SessionColumns | None) -> Trace:
    """The trace, with prefix columns only when some request has a prefix."""
    count = len(arrival_s)
    tag = f"{spec.tenant}-" if spec.tenant else ""
    if sessions is not None:
        request_ids = [f"{tag}{s}-t{t}" for s, t in zip(sessions.session_id, sessions.turn,
                                                         strict=True)]
        sessions = SessionColumns([f"{tag}{s}" for s in sessions.session_id], sessions.turn,
                                  sessions.think_s)
    else:
        request_ids = None if spec.tenant is None else [f"{tag}{i}" for i in range(count)]
    has_prefix = any(ids)
    return Trace.from_arrays(
        name, arrival_s - arrival_s[0], prompt_len, output_len, request_ids,
        tenant=None if spec.tenant is None else [spec.tenant] * count,
        priority=None if spec.priority is None else np.full(count, spec.priority),
        prefix_hash_ids=ids if has_prefix else None,
        prefix_hash_tokens=tokens if has_prefix else None,
        sessions=sessions,
    )


__all__ = ["LengthDist", "SessionSpec", "Stage", "check_shaped", "generate_shaped"]
