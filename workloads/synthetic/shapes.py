"""Workload shapes on top of the synthetic spec: load stages, shared system prompts (as
inference-perf's shared_prefix) and multi-turn sessions, with token-granular prefix segments
so the prefix cache sees exactly what the requests share."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

from workloads.sessions import SessionSpec, session_rows
from workloads.synthetic.arrivals import open_loop_arrivals_s, stage_arrivals_s
from workloads.trace import SessionColumns, Trace

if TYPE_CHECKING:  # the spec's module runs this one; the spec is only read here
    from workloads.synthetic.generators import SyntheticSpec


class SegmentIds:
    """Fresh prefix hash ids, unique within a trace (a tenant's part gets its own range)."""

    def __init__(self, tenant: str | None) -> None:
        # The tenant's 31-bit hash picks its range: shifted by 32 it stays an int64.
        self._next = ((zlib.crc32((tenant or "").encode()) & 0x7FFF_FFFF) << 32) + 1

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

