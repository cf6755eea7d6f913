"""Multi-turn sessions: turn k's prompt is turn k-1's prompt, its answer and a new question,
with the oldest turns dropped to fit max_model_len as chat clients truncate.

A turn's arrival_s is the previous turn's arrival plus its think time (as if answers were
instant): that is what an open-loop replay sends. A closed-loop driver instead releases turn
k think_s after turn k-1's answer finished, from the trace's session_id, turn and think_s:
`chains_of` groups the rows as both closed-loop drivers (the load client's
servelab.bench.closed_loop
and the simulator's sim.cluster.closed_loop) release them.

A server caches the blocks of the answer it generates, and the next turn's prompt carries
those very tokens: `answer_segments` names each turn's answer by the segment the next turn
gives it, so the simulator and the reuse ceiling find it where a live cache does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from workloads.synthetic.lengths import LengthDist
from workloads.trace import Trace


@dataclass(frozen=True)
class Seconds:
    """A distribution of durations in seconds (think times): fixed, uniform, lognormal or
    exponential; every draw is >= 0."""

    kind: str  # "fixed", "uniform", "lognormal" or "exponential"
    a: float  # fixed: the value; uniform: low; lognormal: median; exponential: mean
    b: float = 0.0  # uniform: high; lognormal: sigma

    def __post_init__(self) -> None:
        checks = {
            "fixed": self.a >= 0,
            "uniform": 0 <= self.a <= self.b,
            "lognormal": self.a > 0 and self.b >= 0,
            "exponential": self.a > 0,
        }
        if self.kind not in checks:
            raise ValueError(f"unknown duration distribution {self.kind!r}")
        if not (np.isfinite(self.a) and np.isfinite(self.b)) or not checks[self.kind]:
            raise ValueError(
                "think times must be >= 0 seconds (uniform needs 0 <= LO <= HI; lognormal "
                "and exponential a value > 0)"
            )

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """`count` durations in seconds."""
        if self.kind == "fixed":
            return np.full(count, self.a)
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b, count)
        if self.kind == "lognormal":
            return rng.lognormal(np.log(self.a), self.b, count)
        return rng.exponential(self.a, count)


@dataclass(frozen=True)
class SessionSpec:
    """`users` conversations of `turns` turns, `think` seconds between an answer and the
    next question; the question and answer lengths are the spec's prompt and output."""

    users: int
    turns: LengthDist
    think: Seconds

    def __post_init__(self) -> None:
        if self.users < 1:
            raise ValueError(f"users must be >= 1, got {self.users}")


@dataclass(frozen=True)
class SessionRows:
    """Every turn of every session, in session order (arrays index the same rows)."""

    session_id: list[str]
    turn: np.ndarray
    think_s: np.ndarray
    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    ids: list[list[int]]  # prefix segment ids of each prompt
    tokens: list[list[int]]  # and their token counts


def session_rows(
    session: SessionSpec,
    starts_s: np.ndarray,
    system: list[list[tuple[int, int]]],
    question: LengthDist,
    answer: LengthDist,
    max_model_len: int | None,
    take_ids: Callable[[int], np.ndarray],
    rng: np.random.Generator,
) -> SessionRows:
    """Draw every session's turns: lengths, think times and the prompts' segments."""
    turns = session.turns.sample(session.users, rng)
    total = int(turns.sum())
    questions, answers = question.sample(total, rng), answer.sample(total, rng)
    think_s = session.think.sample(total, rng)
    first = np.concatenate([[0], np.cumsum(turns)[:-1]])
    think_s[first] = 0.0  # a session's first turn waits on nothing
    question_ids, answer_ids = take_ids(total), take_ids(total)
    rows = SessionRows([], np.zeros(total, np.int64), think_s, np.zeros(total),
                       np.zeros(total, np.int64), answers, [], [])
    row = 0
    for user in range(session.users):
        history: list[tuple[int, int]] = []  # (id, tokens) of earlier questions and answers
        arrival_s = float(starts_s[user])
        for k in range(int(turns[user])):
            arrival_s += float(think_s[row])
            q_len = int(questions[row])
            if max_model_len is not None:
                history, q_len = _truncate(system[user], history, q_len, int(answers[row]),
                                           max_model_len)
            segments = [*system[user], *history, (int(question_ids[row]), q_len)]
            rows.session_id.append(f"s{user}")
            rows.turn[row], rows.arrival_s[row] = k, arrival_s
            rows.prompt_len[row] = sum(count for _, count in segments)
            rows.ids.append([hash_id for hash_id, _ in segments])
            rows.tokens.append([count for _, count in segments])
            history += [segments[-1], (int(answer_ids[row]), int(answers[row]))]
            row += 1
    return rows


def _truncate(system: list[tuple[int, int]], history: list[tuple[int, int]], q_len: int,
              answer_len: int, max_model_len: int) -> tuple[list[tuple[int, int]], int]:
    """Drop the oldest question-answer pairs until prompt and answer fit max_model_len; the
    system prompt stays. A lone question too long for it is cut (its end kept)."""
    system_len = sum(count for _, count in system)
    room = max_model_len - system_len - answer_len
    if room < 1:
        raise ValueError(
            f"max_len={max_model_len}: an answer of {answer_len} tokens after a "
            f"{system_len}-token system prompt leaves no room for a question"
        )
    q_len = min(q_len, room)
    while history and sum(count for _, count in history) + q_len > room:
        history = history[2:]  # one turn: its question and its answer
    return history, q_len


@dataclass(frozen=True)
class Chain:
    """Requests that wait for each other: one session's turns in order (indices into the
    run's request list), or a lone request."""

    session_id: str | None
    start_s: float  # the first request's trace time
    rows: tuple[int, ...]


def chains_of(sessions: Sequence[str | None], turns: Sequence[int],
              arrivals_s: Sequence[float]) -> list[Chain]:
    """Group rows into chains, in the order of their first request's trace time."""
    by_session: dict[str, list[int]] = {}
    lone: list[Chain] = []
    for row, session in enumerate(sessions):
        if session is None:
            lone.append(Chain(None, float(arrivals_s[row]), (row,)))
        else:
            by_session.setdefault(session, []).append(row)
    chains = lone
    for session, rows in by_session.items():
        rows.sort(key=lambda r: turns[r])
        chains.append(Chain(session, min(float(arrivals_s[r]) for r in rows), tuple(rows)))
    return sorted(chains, key=lambda c: c.start_s)


def answer_segments(trace: Trace) -> list[tuple[int, int] | None]:
    """Per row, the segment (id, tokens) that stands for its answer: the segment the same
    session's next turn puts right after this row's whole prompt, if as long as this row's
    output; None otherwise (the last turn, a truncated history, no sessions or segments)."""
    answers: list[tuple[int, int] | None] = [None] * len(trace)
    if not trace.has_sessions or not trace.has_prefix_hashes:
        return answers
    table = trace.table
    ids, tokens = table["prefix_hash_ids"].tolist(), trace.prefix_tokens()
    prompt, output = trace.prompt_len.tolist(), trace.output_len.tolist()
    turns = table["turn"].tolist()
    rows: dict[str, list[int]] = {}
    for row, session in enumerate(table["session_id"].tolist()):
        rows.setdefault(session, []).append(row)
    for session_rows in rows.values():
        session_rows.sort(key=lambda r: turns[r])
        for a, b in zip(session_rows, session_rows[1:], strict=False):
            n = len(ids[a])
            if (len(ids[b]) > n and list(ids[b][:n]) == list(ids[a])
                    and list(tokens[b][:n]) == list(tokens[a]) and sum(tokens[a]) == prompt[a]
                    and tokens[b][n] == output[a]):
                answers[a] = (int(ids[b][n]), int(tokens[b][n]))
    return answers
