"""The peer workload shared by the executor and serving benchmarks (numpy only, no torch)."""

from __future__ import annotations

import numpy as np

VOCAB = 32000


def peer_workload(seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """32 prompts and output lengths, drawn in the issue's order from default_rng(seed)."""
    rng = np.random.default_rng(seed)
    prompt_lens = np.clip(np.round(rng.lognormal(np.log(64), 0.5, 32)), 8, 512).astype(int)
    output_lens = np.clip(np.round(rng.lognormal(np.log(32), 1.0, 32)), 4, 256).astype(int)
    prompts = [rng.integers(3, VOCAB, int(n)).tolist() for n in prompt_lens]
    return prompts, output_lens.tolist()
