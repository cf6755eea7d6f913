"""Per-token seeds: a request's random stream depends only on its seed and the token index.

Torch-free, so the simulated server draws its tokens by the same rule as the sampler.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1


def token_seed(seed: int, index: int) -> int:
    """A well-mixed 63-bit seed for output token `index` of a request seeded `seed`."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xD1B54A32D192ED03) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64  # splitmix64 finalizer
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1
