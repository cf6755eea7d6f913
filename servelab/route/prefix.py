"""The router's approximate prefix index: which upstream was sent which prompt blocks.

The router cannot see the upstreams' KV caches, so, like SGLang's cache-aware router, it
remembers what it routed where: the prompt is cut into fixed-size blocks, each block keyed
by BLAKE2b of its parent's key and its content (equal keys mean equal prefixes), and an LRU
map holds key -> the upstreams that were sent it. docs/route.md says what this misses.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from servelab.serve.protocol import DEFAULT_MAX_TOKENS

# Text prompts are indexed by their UTF-8 bytes, this many per token of a block: about what
# an English BPE token spans, so a text block covers about as much prompt as a token block.
BYTES_PER_TOKEN = 4


@dataclass(frozen=True)
class PromptBlocks:
    """A prompt as the index sees it; lengths are in `unit` (tokens or UTF-8 bytes)."""

    prompt_len: int  # in `unit`; the length Router.choose compares cached_tokens against
    block_len: int  # in `unit`: one key covers this much prompt
    keys: tuple[bytes, ...]  # one per full block, each chained from the one before
    unit: str  # "tokens" or "bytes"

    def __post_init__(self) -> None:
        if self.unit not in ("tokens", "bytes"):
            raise ValueError(f"PromptBlocks.unit must be 'tokens' or 'bytes', got {self.unit!r}")
        if self.block_len < 1:
            raise ValueError(f"PromptBlocks.block_len must be >= 1, got {self.block_len}")


def prompt_blocks(body: object, block_tokens: int) -> PromptBlocks:
    """The prompt of a completions or chat body, cut into keyed blocks (empty if none)."""
    content = _prompt_content(body)
    if isinstance(content, bytes):
        return _blocks(content, 1, block_tokens * BYTES_PER_TOKEN, "bytes")
    try:
        ids = array("q", content)  # int64: 8 bytes per id
    except OverflowError:  # an id outside int64: the upstream will reject the body
        return PromptBlocks(len(content), block_tokens, (), "tokens")
    return _blocks(ids.tobytes(), ids.itemsize, block_tokens, "tokens")


def _blocks(data: bytes, unit_bytes: int, block_len: int, unit: str) -> PromptBlocks:
    """Chained keys of the full blocks of `data` (unit_bytes bytes per token or byte)."""
    step = unit_bytes * block_len  # bytes per block
    person = unit.encode()  # token and byte blocks never share a key
    keys, parent = [], b""
    for start in range(0, len(data) - step + 1, step):
        digest = hashlib.blake2b(parent, digest_size=16, person=person)
        digest.update(data[start:start + step])
        parent = digest.digest()
        keys.append(parent)
    return PromptBlocks(len(data) // unit_bytes, block_len, tuple(keys), unit)


def kv_tokens_estimate(body: object) -> int:
    """The KV a request will hold at its end, in tokens: prompt (text at BYTES_PER_TOKEN
    bytes a token) plus max_tokens."""
    content = _prompt_content(body)
    prompt = len(content) if isinstance(content, list) else -(-len(content) // BYTES_PER_TOKEN)
    return prompt + max_tokens_of(body)


def max_tokens_of(body: object) -> int:
    """The most tokens the request may generate (chat: either field; OpenAI's default)."""
    fields = body if isinstance(body, dict) else {}
    limits = (fields.get("max_tokens"), fields.get("max_completion_tokens"))
    return next((n for n in limits if type(n) is int and n >= 0), DEFAULT_MAX_TOKENS)


def _prompt_content(body: object) -> list[int] | bytes:
    """Token ids if the body carries ids, else the text's UTF-8 bytes (the first prompt of a
    batch; a chat's messages as role and content per message)."""
    if not isinstance(body, dict):
        return b""
    prompt = body.get("prompt")
    if prompt is None and isinstance(body.get("messages"), list):
        return _chat_text(body["messages"]).encode()
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt.encode()
    if isinstance(prompt, list) and all(type(t) is int for t in prompt):
        return prompt
    return b""


def _chat_text(messages: list) -> str:
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content
                              if isinstance(p, dict) and isinstance(p.get("text"), str))
        parts.append(f"{message.get('role', '')}\n{content if isinstance(content, str) else ''}\n")
    return "".join(parts)


class PrefixIndex:
    """LRU map block key -> bitmask of the upstreams it was routed to (bit i: upstream i)."""

    def __init__(self, max_keys: int = 1 << 20) -> None:
        if max_keys < 1:
            raise ValueError(f"PrefixIndex max_keys must be >= 1, got {max_keys}")
        self.max_keys = max_keys
        self._holders: OrderedDict[bytes, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._holders)

    def matched_blocks(self, keys: tuple[bytes, ...], num_upstreams: int) -> list[int]:
        """Per upstream, how many leading blocks of `keys` it was sent (its longest run)."""
        runs = [0] * num_upstreams
        alive = (1 << num_upstreams) - 1
        for depth, key in enumerate(keys, start=1):
            alive &= self._holders.get(key, 0)
            if not alive:
                break
            for i in range(num_upstreams):
                if alive >> i & 1:
                    runs[i] = depth
        return runs

    def record(self, keys: tuple[bytes, ...], upstream: int) -> None:
        """Note that `upstream` was sent these blocks; evict the least recently used keys."""
        bit = 1 << upstream
        holders = self._holders
        # Deepest block first, so a prompt's first blocks end up the most recently used:
        # eviction then trims long tails before the shared prefixes they hang from.
        for key in reversed(keys):
            holders[key] = holders.get(key, 0) | bit
            holders.move_to_end(key)
        while len(holders) > self.max_keys:
            holders.popitem(last=False)
