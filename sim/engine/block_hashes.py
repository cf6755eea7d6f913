"""Content keys of full KV blocks, chained block to block, for prefix caching.

Block j's key combines block j-1's key with block j's own content, so equal keys mean equal
prefixes. Content is the token ids where a request has them (executor, server), hashed with
BLAKE2b: a collision would serve another prompt's KV, so the hash must be strong. In pure
simulation the trace's prefix hash ids stand for the content (Mooncake: one id per
`PREFIX_BLOCK_TOKENS` prompt tokens; token-granular traces state each id's token count),
equal ids for equal content (a session turn's last id may cover its output: the answer the
next turn's prompt carries); tokens that no hash id covers (the rest of the prompt, the
output) are unique to their request: only the request's own recompute after preemption can
find them. A block is shared only when every one of its tokens is covered, so a 100-token
shared prefix shares 6 blocks of 16 and the 7th, part prefix and part question, stays own.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from bisect import bisect_right
from itertools import accumulate

from sim.engine.core import Request
from workloads.trace import PREFIX_BLOCK_TOKENS


def num_shareable_blocks(request: Request, block_size: int) -> int:
    """Leading blocks whose content another request may share: all of them with token ids,
    else those the trace's hash ids cover (the rest is the request's own)."""
    if request.prompt_token_ids is not None:
        return sys.maxsize
    if not request.prefix_hash_ids:
        return 0
    return covered_tokens(request) // block_size


def covered_tokens(request: Request) -> int:
    """Leading tokens the trace's prefix hash ids cover: prompt tokens, and with token-granular
    segments, output tokens too where a session's next turn names the answer
    (sim.replay.workload)."""
    ids = request.prefix_hash_ids or ()
    if request.prefix_hash_tokens is not None:
        return min(request.prompt_len + request.max_new_tokens, sum(request.prefix_hash_tokens))
    return min(request.prompt_len, len(ids) * PREFIX_BLOCK_TOKENS)


def block_hashes(request: Request, num_blocks: int, block_size: int) -> list:
    """The keys of request's first num_blocks full blocks (computed once, kept on it)."""
    hashes = request.block_hashes
    if len(hashes) >= num_blocks:
        return hashes
    if request.prompt_token_ids is not None:
        for j in range(len(hashes), num_blocks):
            parent = hashes[j - 1] if j else None
            hashes.append(_token_key(request, parent, j * block_size, block_size))
    else:
        _extend_trace_keys(request, num_blocks, block_size)
    return hashes


def _token_key(request: Request, parent: bytes | None, start: int, block_size: int) -> bytes:
    """BLAKE2b of the parent key and the block's token ids (prompt then output)."""
    prompt = request.prompt_token_ids
    end = start + block_size
    if end <= len(prompt):
        tokens = prompt[start:end]
    else:
        tokens = (prompt + request.output_token_ids)[start:end]
    if len(tokens) != block_size:
        raise ValueError(f"request {request.request_id}: block at token {start} is not full")
    digest = hashlib.blake2b(parent or b"", digest_size=16)
    digest.update(array("q", tokens).tobytes())
    return digest.digest()


def _extend_trace_keys(request: Request, num_blocks: int, block_size: int) -> None:
    """Keys from the trace's hash ids over each block, or from the request's identity where
    no id covers the whole block (Python's 64-bit hash: a collision only merges two counts).

    A covered block's key names, for each segment (one id's tokens) it overlaps, the id and
    the block's start relative to the segment's start: that fixes every token's content.
    """
    hashes = request.block_hashes
    ids = request.prefix_hash_ids or ()
    counts = request.prefix_hash_tokens or (PREFIX_BLOCK_TOKENS,) * len(ids)
    ends = list(accumulate(counts))  # segment k covers [ends[k] - counts[k], ends[k])
    covered = covered_tokens(request)
    parent = hashes[-1] if hashes else None
    for start in range(len(hashes) * block_size, num_blocks * block_size, block_size):
        last = start + block_size - 1
        if last >= covered:
            parent = hash((parent, request.request_id, start))
        else:
            first, final = bisect_right(ends, start), bisect_right(ends, last)
            pieces = tuple(
                (ids[k], start - (ends[k] - counts[k])) for k in range(first, final + 1)
            )
            parent = hash((parent, pieces))
        hashes.append(parent)
