"""Trace transforms: slice by time or count, rescale the rate, rescale or clip lengths.

Each returns a new Trace and never mutates its input. `TraceTransforms.apply` runs them in
one documented order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workloads.trace import PREFIX_BLOCK_TOKENS, Trace


def head(trace: Trace, max_requests: int) -> Trace:
    """The first `max_requests` requests."""
    if max_requests < 1:
        raise ValueError(f"max_requests must be >= 1, got {max_requests}")
    return Trace(trace.name, trace.table.iloc[:max_requests].reset_index(drop=True))


def time_window(trace: Trace, start_s: float = 0.0, end_s: float | None = None) -> Trace:
    """Requests with start_s <= arrival_s < end_s, shifted so the first arrives at 0."""
    arrival_s = trace.arrival_s
    first = int(np.searchsorted(arrival_s, start_s, side="left"))
    last = len(arrival_s) if end_s is None else int(np.searchsorted(arrival_s, end_s, "left"))
    if first >= last:
        raise ValueError(
            f"{trace.name}: no requests in the window [{start_s}, {end_s}) s "
            f"(the trace spans 0 to {trace.span_s:.1f} s)"
        )
    table = trace.table.iloc[first:last].reset_index(drop=True)
    return Trace(trace.name, table.assign(arrival_s=arrival_s[first:last] - arrival_s[first]))


def scale_qps(trace: Trace, factor: float) -> Trace:
    """Multiply the arrival rate by `factor` (> 1 compresses the gaps between arrivals)."""
    if not factor > 0 or not math.isfinite(factor):
        raise ValueError(f"qps scale must be a positive number, got {factor}")
    return Trace(trace.name, trace.table.assign(arrival_s=trace.arrival_s / factor))


def scale_lengths(trace: Trace, factor: float, output_factor: float | None = None) -> Trace:
    """Multiply prompt lengths by `factor` and output lengths by `output_factor` (default:
    `factor` too), each rounded to the nearest integer >= 1."""
    factors = (factor, factor if output_factor is None else output_factor)
    for f in factors:
        if not f > 0 or not math.isfinite(f):
            raise ValueError(f"length scale must be a positive number, got {f}")

    def scaled(lengths: np.ndarray, f: float) -> np.ndarray:
        return np.maximum(np.floor(lengths * f + 0.5), 1).astype(np.int64)

    table = trace.table.assign(output_len=scaled(trace.output_len, factors[1]))
    return Trace(trace.name, _with_prompt_len(table, scaled(trace.prompt_len, factors[0])))


def clip_lengths(
    trace: Trace, max_prompt_len: int | None = None, max_output_len: int | None = None
) -> Trace:
    """Cap prompt and/or output lengths (to fit a small model's context)."""
    table = trace.table
    if max_output_len is not None:
        _check_cap("max_output_len", max_output_len)
        table = table.assign(output_len=np.minimum(trace.output_len, max_output_len))
    if max_prompt_len is not None:
        _check_cap("max_prompt_len", max_prompt_len)
        table = _with_prompt_len(table, np.minimum(trace.prompt_len, max_prompt_len))
    return Trace(trace.name, table)


def _check_cap(name: str, cap: int) -> None:
    if cap < 1:
        raise ValueError(f"{name} must be >= 1, got {cap}")


def _with_prompt_len(table: pd.DataFrame, prompt_len: np.ndarray) -> pd.DataFrame:
    """Set prompt lengths; prefix block ids beyond the (shorter) prompt are dropped."""
    table = table.assign(prompt_len=prompt_len)
    if "prefix_hash_tokens" in table.columns:  # token-granular: cut the prefix at the prompt
        cut = [
            _cut_segments(ids, tokens, length)
            for ids, tokens, length in zip(
                table["prefix_hash_ids"], table["prefix_hash_tokens"], prompt_len, strict=True
            )
        ]
        return table.assign(
            prefix_hash_ids=pd.Series([ids for ids, _ in cut], dtype=object),
            prefix_hash_tokens=pd.Series([tokens for _, tokens in cut], dtype=object),
        )
    if "prefix_hash_ids" in table.columns:
        blocks = -(-prompt_len // PREFIX_BLOCK_TOKENS)  # ceil: blocks covering the prompt
        kept = [ids[:count] for ids, count in zip(table["prefix_hash_ids"], blocks, strict=True)]
        table = table.assign(prefix_hash_ids=pd.Series(kept, dtype=object))
    return table


def _cut_segments(ids: list[int], tokens: list[int], prompt_len: int) -> tuple[list, list]:
    """The prefix segments within the first prompt_len tokens (the last one shortened)."""
    kept_ids, kept_tokens, covered = [], [], 0
    for hash_id, count in zip(ids, tokens, strict=True):
        if covered >= prompt_len:
            break
        kept_ids.append(hash_id)
        kept_tokens.append(int(min(count, prompt_len - covered)))
        covered += kept_tokens[-1]
    return kept_ids, kept_tokens


def with_hash_block_tokens(trace: Trace, block_tokens: int) -> Trace:
    """The trace with each prefix hash id covering `block_tokens` prompt tokens (a timed
    trace's stated block size; Mooncake's is PREFIX_BLOCK_TOKENS), cut at each prompt."""
    _check_cap("hash block tokens", block_tokens)
    if not trace.has_prefix_hashes:
        raise ValueError(f"{trace.name}: has no prefix hash ids for a hash block size to apply to")
    table = trace.table
    if "prefix_hash_tokens" in table.columns:
        raise ValueError(f"{trace.name}: already states the tokens of each prefix hash id")
    tokens = [[block_tokens] * len(ids) for ids in table["prefix_hash_ids"]]
    table = table.assign(prefix_hash_tokens=pd.Series(tokens, dtype=object))
    return Trace(trace.name, _with_prompt_len(table, table["prompt_len"].to_numpy()))


@dataclass(frozen=True)
class TraceTransforms:
    """Transforms applied in this order: time window, first N, rate, length scale, clipping.

    Selection (window, count) happens in the trace's own time; the window is re-zeroed.
    Prompt lengths are scaled by length_scale * prompt_scale, output lengths by
    length_scale * output_scale (code traces have long prompts and short outputs).
    """

    start_s: float = 0.0
    end_s: float | None = None
    max_requests: int | None = None
    qps_scale: float = 1.0
    length_scale: float = 1.0
    prompt_scale: float = 1.0
    output_scale: float = 1.0
    max_prompt_len: int | None = None
    max_output_len: int | None = None

    def __post_init__(self) -> None:
        if not self.start_s >= 0:
            raise ValueError(f"start_s must be >= 0, got {self.start_s}")
        if self.end_s is not None and not self.end_s > self.start_s:
            raise ValueError(f"end_s must be > start_s, got {self.end_s} <= {self.start_s}")
        for name in ("max_requests", "max_prompt_len", "max_output_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in ("qps_scale", "length_scale", "prompt_scale", "output_scale"):
            value = getattr(self, name)
            if not value > 0 or not math.isfinite(value):
                raise ValueError(f"{name} must be a positive number, got {value}")

    def apply(self, trace: Trace) -> Trace:
        """The transformed trace (the input is left as it is)."""
        if self.start_s > 0 or self.end_s is not None:
            trace = time_window(trace, self.start_s, self.end_s)
        if self.max_requests is not None:
            trace = head(trace, self.max_requests)
        if self.qps_scale != 1.0:
            trace = scale_qps(trace, self.qps_scale)
        prompt_factor = self.length_scale * self.prompt_scale
        output_factor = self.length_scale * self.output_scale
        if prompt_factor != 1.0 or output_factor != 1.0:
            trace = scale_lengths(trace, prompt_factor, output_factor)
        if self.max_prompt_len is not None or self.max_output_len is not None:
            trace = clip_lengths(trace, self.max_prompt_len, self.max_output_len)
        return trace
