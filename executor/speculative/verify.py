"""Verification of proposals: a verifying row's logits rows go to the sampler's verify
(greedy: accepted while equal to the argmax, so the row produces exactly what one-token
decoding would; sampling: rejection sampling, which keeps the target distribution); the
other rows are sampled together as in a step without proposals."""

from __future__ import annotations

import torch

from executor.batch import Segment
from executor.sampling import Sampler


def sample_and_verify(sampler: Sampler, logits: torch.Tensor, segments: list[Segment]
                      ) -> tuple[dict[str, int], dict[str, list[int]]]:
    """From a step's logits [S, vocab] (one row per sampling sequence, 1 + k per verifying
    one, in segment order): the plain rows' tokens, and each verifying row's produced tokens
    (its accepted proposals, then the token after them)."""
    plain_rows: list[int] = []
    plain = []
    produced: dict[str, list[int]] = {}
    row = 0
    for segment in segments:
        if not segment.samples:
            continue
        drafts = segment.drafts
        if drafts:
            rows = logits[row:row + 1 + len(drafts)]
            produced[segment.request.request_id] = sampler.verify(rows, segment.request, drafts)
        else:
            plain_rows.append(row)
            plain.append(segment.request)
        row += 1 + len(drafts)
    tokens = sampler.sample(logits[plain_rows], plain) if plain else []
    return {r.request_id: t for r, t in zip(plain, tokens, strict=True)}, produced
