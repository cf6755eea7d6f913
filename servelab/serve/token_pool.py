"""Tokens a model without real weights emits: ids whose text re-encodes to the same ids.

Clients such as aiperf count output tokens by encoding the text they received. A run of
one token ("xxxx") merges under a BPE tokenizer, so they would count 2 tokens where the
server sent 128. The pool holds ids that survive decode-then-encode next to each other
(whole words between the pre-tokenizer's splits, or single bytes), checked on a drawn
sequence, and each request draws from it by its seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from executor.seeds import token_seed
from servelab.serve.tokenizer import Tokenizer

POOL_SIZE = 512  # ids kept: plenty of variety, and a start-up check of milliseconds
MAX_SCANNED = 20_000  # candidates tried before giving up on filling the pool
CHECK_TOKENS = 256  # length of the drawn sequence the whole pool is checked with
CONTEXT = 8  # accepted ids a candidate is tried next to


class NoRoundTripTokens(ValueError):
    """The tokenizer has no ids whose text re-encodes to themselves."""


def round_trip_token_ids(tokenizer: Tokenizer, size: int = POOL_SIZE) -> tuple[int, ...]:
    """Up to `size` ids (sorted) that any sequence drawn from them re-encodes to itself.

    Whole words first: ids whose text is letters that the decoder separates from the next
    id by a space (" holders", or a word-level tokenizer's "hello"), so every pre-tokenizer
    that splits at spaces encodes each on its own. A tokenizer with none (byte-level,
    without merges) gets any printable id that keeps itself next to its neighbours.
    """
    for is_word in (True, False):
        pool = _scan(tokenizer, size, is_word)
        sample = [draw_token(pool, 0, index) for index in range(CHECK_TOKENS)] if pool else []
        if pool and _round_trips(tokenizer, sample):
            return pool
    raise NoRoundTripTokens(f"tokenizer {tokenizer.name}: no set of tokens whose text "
                            "re-encodes to themselves; cannot draw simulated output")


def _scan(tokenizer: Tokenizer, size: int, is_word: bool) -> tuple[int, ...]:
    """Candidates in a fixed shuffled order, each kept if it round-trips after the last
    CONTEXT kept ones (and, for words, is one)."""
    order = np.random.default_rng(0).permutation(tokenizer.vocab_size)[:MAX_SCANNED]
    pool: list[int] = []
    for token in order.tolist():
        if (not is_word or _is_word(tokenizer, token)) and \
                _keeps_itself(tokenizer, pool[-CONTEXT:], token):
            pool.append(token)
            if len(pool) == size:
                break
    return tuple(sorted(pool))


def _is_word(tokenizer: Tokenizer, token: int) -> bool:
    """ASCII letters whose repeat the decoder writes with a space between ("a a")."""
    first, *rest = tokenizer.decode([token, token]).strip().split(" ")
    return rest == [first] and first.isascii() and first.isalpha()


def _keeps_itself(tokenizer: Tokenizer, context: list[int], token: int) -> bool:
    """Whether token is printable text, no special token, and round-trips twice in a row
    after the context (a run of it must not merge, nor it with its neighbours)."""
    if token == tokenizer.eos_token_id:
        return False
    text = tokenizer.decode([token])
    if not text.strip() or not text.isprintable() or "\ufffd" in text:
        return False
    return _round_trips(tokenizer, [*context, token, token])


def _round_trips(tokenizer: Tokenizer, token_ids: list[int]) -> bool:
    text = tokenizer.decode(token_ids)
    return tokenizer.encode(text, add_special_tokens=False) == token_ids


def draw_token(pool: Sequence[int], seed: int, index: int) -> int:
    """Output token `index` of a request seeded `seed`: the same whatever the batch."""
    return pool[token_seed(seed, index) % len(pool)]
