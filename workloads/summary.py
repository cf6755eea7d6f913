"""Trace statistics: counts, rate, burstiness, length percentiles, prefix reuse and a line
per tenant and per priority, as a table or JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from workloads.sessions import answer_segments
from workloads.trace import Trace

MAX_GROUP_LINES = 20  # a log with a tenant per user would bury the table; JSON keeps all


@dataclass(frozen=True)
class GroupSummary:
    """The requests of one tenant or one priority class."""

    group: str | int  # the tenant name, or the priority
    requests: int
    rate_per_s: float | None  # (requests - 1) / the group's own first-to-last span; None if 0
    prompt_len_mean: float
    output_len_mean: float


@dataclass(frozen=True)
class TraceSummary:
    """What `servelab trace` prints; percentiles use numpy's default (linear)."""

    name: str
    requests: int
    span_s: float
    rate_per_s: float | None  # (requests - 1) / span_s; None when the span is 0
    interarrival_cv: float | None  # std / mean of the gaps (population std); None if no gaps
    burst_peak_1s: int  # most arrivals in one 1-s bin, bins from t = 0
    prompt_len_mean: float
    prompt_len_p50: float
    prompt_len_p99: float
    output_len_mean: float
    output_len_p50: float
    output_len_p99: float
    prefix_blocks: int | None = None  # prefix block ids in all rows (None without ids)
    unique_prefix_blocks: int | None = None
    # Prefix cache hit rate with an unbounded KV pool (prefix_reuse_ceiling); None without ids
    # or without the engine's block size.
    prefix_reuse_ceiling: float | None = None
    sessions: int | None = None  # conversations (or closed-loop users); None: no sessions
    turns_mean: float | None = None  # requests per session
    think_s_mean: float | None = None  # over turns after the first
    tenants: tuple[GroupSummary, ...] | None = None  # in order of first arrival; None: no column
    priorities: tuple[GroupSummary, ...] | None = None  # lowest (served first) first

    def to_dict(self) -> dict:
        """Plain JSON-ready values."""
        return asdict(self)


def summarize(trace: Trace, block_size: int | None = None) -> TraceSummary:
    """Compute a TraceSummary (vectorized: milliseconds for 20k requests); with the engine's
    KV `block_size`, the prefix reuse ceiling in its blocks too."""
    arrival_s, prompt, output = trace.arrival_s, trace.prompt_len, trace.output_len
    gaps_s = np.diff(arrival_s)
    span_s = trace.span_s
    cv = float(gaps_s.std() / gaps_s.mean()) if len(gaps_s) and gaps_s.mean() > 0 else None
    blocks = unique = ceiling = None
    if trace.has_prefix_hashes:
        ids = [block for row in trace.table["prefix_hash_ids"] for block in row]
        blocks, unique = len(ids), len(set(ids))
        ceiling = None if block_size is None else prefix_reuse_ceiling(trace, block_size)
    return TraceSummary(
        name=trace.name,
        requests=len(trace),
        span_s=span_s,
        rate_per_s=_rate(len(trace), span_s),
        interarrival_cv=cv,
        burst_peak_1s=int(np.bincount(np.floor(arrival_s).astype(np.int64)).max()),
        prompt_len_mean=float(prompt.mean()),
        prompt_len_p50=float(np.percentile(prompt, 50)),
        prompt_len_p99=float(np.percentile(prompt, 99)),
        output_len_mean=float(output.mean()),
        output_len_p50=float(np.percentile(output, 50)),
        output_len_p99=float(np.percentile(output, 99)),
        prefix_blocks=blocks,
        unique_prefix_blocks=unique,
        prefix_reuse_ceiling=ceiling,
        **_session_stats(trace),
        tenants=summarize_groups(trace, "tenant"),
        priorities=summarize_groups(trace, "priority"),
    )


def _session_stats(trace: Trace) -> dict:
    """Sessions, mean turns per session and mean think time (turns after the first)."""
    if not trace.has_sessions:
        return {}
    table = trace.table
    sessions = int(table["session_id"].nunique())
    later = table.loc[table["turn"] > 0, "think_s"]
    return {"sessions": sessions, "turns_mean": len(table) / sessions,
            "think_s_mean": float(later.mean()) if len(later) else None}


def summarize_groups(trace: Trace, column: str) -> tuple[GroupSummary, ...] | None:
    """One GroupSummary per value of `column` ("tenant" or "priority"); None without it."""
    if column not in trace.table:
        return None
    # Tenants keep first-arrival order (a spec's part order); priorities sort, lowest first.
    grouped = trace.table.groupby(column, sort=column == "priority")
    stats = grouped.agg(
        requests=("arrival_s", "size"),
        first_s=("arrival_s", "min"),
        last_s=("arrival_s", "max"),
        prompt_len_mean=("prompt_len", "mean"),
        output_len_mean=("output_len", "mean"),
    )
    return tuple(
        GroupSummary(
            group=key.item() if hasattr(key, "item") else key,  # np.int64 -> int for JSON
            requests=int(row.requests),
            rate_per_s=_rate(int(row.requests), float(row.last_s - row.first_s)),
            prompt_len_mean=float(row.prompt_len_mean),
            output_len_mean=float(row.output_len_mean),
        )
        for key, row in stats.iterrows()
    )


def _rate(requests: int, span_s: float) -> float | None:
    return (requests - 1) / span_s if span_s > 0 else None


def prefix_reuse_ceiling(trace: Trace, block_size: int) -> float:
    """Share of prompt tokens a prefix cache that never evicts could serve (0 without ids).

    In arrival order, a request reuses the longest prefix of its hash ids (with their token
    counts) that begins some earlier request's; of that, only full KV blocks of `block_size`
    tokens count, and at least one prompt token is always computed (the step that samples
    the first token). A session turn's answer (workloads.sessions.answer_segments) counts as
    cached after its prompt, all but its last token (the sampled one, never computed).
    """
    if block_size < 1:
        raise ValueError(f"prefix_reuse_ceiling: block_size must be >= 1, got {block_size}")
    prompt = trace.prompt_len
    if not trace.has_prefix_hashes or not prompt.sum():
        return 0.0  # a prompt no id covers is its request's own content
    root: dict = {}  # a trie of every earlier request's segments
    cached = 0
    rows = zip(trace.table["prefix_hash_ids"], trace.prefix_tokens(), prompt.tolist(),
               answer_segments(trace), strict=True)
    for ids, tokens, prompt_len, answer in rows:
        matched, short = _match_and_insert(root, list(zip(ids, tokens, strict=True)), answer)
        matched_tokens = sum(tokens[:matched]) - short
        cached += min(matched_tokens, prompt_len - 1) // block_size * block_size
    return cached / int(prompt.sum())


_SHORT = "short"  # a trie node's key: its segment is an answer, cached short of its last token


def _match_and_insert(root: dict, segments: list[tuple[int, int]],
                      answer: tuple[int, int] | None) -> tuple[int, int]:
    """How many leading segments the trie holds, and 1 if the last of them lacks its last
    token (an answer: nothing after it can match); then add the rest, so it holds them all
    whole, and the answer after them, short."""
    node, matched, short = root, 0, 0
    for segment in segments:
        child = node.get(segment)
        if child is None:
            break
        node, matched = child, matched + 1
        if child.pop(_SHORT, False):  # this prompt computes it whole from now on
            short = 1
            break
    for segment in segments[matched:]:
        node = node.setdefault(segment, {})
    if answer is not None and answer not in node:
        node[answer] = {_SHORT: True}
    return matched, short


def format_summary(summary: TraceSummary) -> str:
    """A human-readable table."""

    def number(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    lines = [
        f"trace            {summary.name}",
        f"requests         {summary.requests}",
        f"span_s           {number(summary.span_s, 1)}",
        f"rate_per_s       {number(summary.rate_per_s, 2)}",
        f"interarrival_cv  {number(summary.interarrival_cv, 2)}",
        f"burst_peak_1s    {summary.burst_peak_1s}",
    ]
    if summary.prefix_blocks is not None:
        lines.append(
            f"prefix_blocks    {summary.prefix_blocks} ({summary.unique_prefix_blocks} unique)"
        )
        lines.append(
            f"prefix_ceiling   {number(summary.prefix_reuse_ceiling, 4)} "
            "(prefix reuse ceiling: hit rate with an unbounded KV pool)"
        )
    if summary.sessions is not None:
        lines.append(
            f"sessions         {summary.sessions} ({number(summary.turns_mean, 1)} turns each, "
            f"think {number(summary.think_s_mean, 1)} s mean)"
        )
    lines.append(f"{'tokens':<12}{'mean':>10}{'p50':>10}{'p99':>10}")
    for label, values in (
        ("prompt_len", (summary.prompt_len_mean, summary.prompt_len_p50, summary.prompt_len_p99)),
        ("output_len", (summary.output_len_mean, summary.output_len_p50, summary.output_len_p99)),
    ):
        lines.append(f"{label:<12}" + "".join(f"{number(v, 1):>10}" for v in values))
    for label, groups in (("tenant", summary.tenants), ("priority", summary.priorities)):
        if groups is not None:
            lines.extend(_group_lines(label, groups))
    return "\n".join(lines)


def _group_lines(label: str, groups: tuple[GroupSummary, ...]) -> list[str]:
    """A header and one line per group: requests, rate and mean lengths."""
    shown = groups[:MAX_GROUP_LINES]
    width = max(12, *(len(str(group.group)) + 2 for group in shown))
    lines = [
        f"{label:<{width}}{'requests':>10}{'rate_per_s':>12}{'prompt_mean':>13}{'output_mean':>13}"
    ]
    for group in shown:
        rate = "n/a" if group.rate_per_s is None else f"{group.rate_per_s:.2f}"
        lines.append(
            f"{str(group.group):<{width}}{group.requests:>10}{rate:>12}"
            f"{group.prompt_len_mean:>13.1f}{group.output_len_mean:>13.1f}"
        )
    if len(groups) > MAX_GROUP_LINES:
        lines.append(f"(and {len(groups) - MAX_GROUP_LINES} more; --json lists every {label})")
    return lines
