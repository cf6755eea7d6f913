"""N-gram prompt lookup (vLLM's `ngram` method): propose what followed the sequence's suffix
the last time it occurred earlier in the same sequence."""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(token_ids: Sequence[int], num_tokens: int, min_n: int,
                  max_n: int) -> list[int]:
    """Up to num_tokens proposals: for the longest suffix of length max_n..min_n that occurs
    earlier in token_ids, the tokens after its first earlier occurrence; [] without one."""
    length = len(token_ids)
    if num_tokens < 1:
        return []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = list(token_ids[length - n:])
        first = suffix[0]
        for start in range(length - n):  # earlier occurrences only
            if token_ids[start] == first and list(token_ids[start:start + n]) == suffix:
                follow = token_ids[start + n:start + n + num_tokens]
                return list(follow)
    return []
