"""Deterministic synthetic prompt tokens for replaying traces that carry only lengths.

Traces with prefix hash ids (Mooncake: one id per 512-token block) get equal tokens for equal
ids, so shared prefixes really are shared; the rest comes from a per-request generator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from sim.engine.core import Request
from workloads.trace import PREFIX_BLOCK_TOKENS

FIRST_TOKEN_ID = 3  # skip the ids tokenizers usually reserve (pad, bos, eos)
_HASH_DOMAIN = 0x5E7E1AB  # keeps hash-block streams apart from request streams


def stable_seed(key: int | str) -> int:
    """A 63-bit seed from an int or a string, stable across processes (unlike hash())."""
    if isinstance(key, int):
        return key & ((1 << 63) - 1)
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def synth_prompt_tokens(key: int | str, prompt_len: int, vocab_size: int,
                        prefix_hash_ids: Sequence[int] | None = None,
                        hash_block_tokens: int = PREFIX_BLOCK_TOKENS,
                        prefix_hash_tokens: Sequence[int] | None = None) -> list[int]:
    """prompt_len token ids in [3, vocab_size): hash block i from id i alone, the rest from key.

    Block i is prefix_hash_tokens[i] tokens long when given (token-granular prefixes), else
    hash_block_tokens; an id's tokens are the same stream whatever its length, so a prefix
    cut short still shares its start."""
    if prompt_len < 0 or hash_block_tokens < 1:
        raise ValueError(f"prompt_len must be >= 0 and hash_block_tokens >= 1, got "
                         f"{prompt_len}, {hash_block_tokens}")
    low = FIRST_TOKEN_ID if vocab_size > FIRST_TOKEN_ID else 0
    if vocab_size <= low:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    parts: list[np.ndarray] = []
    covered = 0
    ids = list(prefix_hash_ids or ())
    lengths = list(prefix_hash_tokens) if prefix_hash_tokens is not None else None
    if lengths is not None and len(lengths) != len(ids):
        raise ValueError(f"{len(lengths)} prefix token counts for {len(ids)} prefix hash ids")
    for index, hash_id in enumerate(ids):
        if covered >= prompt_len:
            break
        rng = np.random.default_rng([_HASH_DOMAIN, stable_seed(int(hash_id))])
        block = rng.integers(low, vocab_size, hash_block_tokens if lengths is None
                             else lengths[index])
        parts.append(block[: prompt_len - covered])
        covered += len(parts[-1])
    if covered < prompt_len:
        rng = np.random.default_rng(stable_seed(key))
        parts.append(rng.integers(low, vocab_size, prompt_len - covered))
    return np.concatenate(parts).astype(np.int64).tolist() if parts else []


def attach_prompt_tokens(requests: Sequence[Request], vocab_size: int, seed: int = 0) -> None:
    """Give every request without prompt_token_ids synthetic ones (keyed by seed and id;
    equal prefix hash ids give equal tokens, so the prefix cache finds what the trace shares)."""
    for request in requests:
        if request.prompt_token_ids is not None:
            continue
        key = f"{seed}:{request.request_id}"
        request.prompt_token_ids = synth_prompt_tokens(
            key, request.prompt_len, vocab_size, request.prefix_hash_ids,
            prefix_hash_tokens=request.prefix_hash_tokens)
