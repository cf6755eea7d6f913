"""Greedy verification: a row's proposals are accepted while each equals the target model's
token at its position, so a verified row produces exactly what one-token decoding would."""

from __future__ import annotations

from executor.batch import Segment


def verify_greedy(segments: list[Segment],
                  tokens: list[int]) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Split a step's sampled tokens (one per sampling row, 1 + k for a verifying sequence,
    in segment order) into the plain rows' tokens and each verifying row's produced tokens:
    its accepted proposals, then the target's token after them."""
    sampled: dict[str, int] = {}
    produced: dict[str, list[int]] = {}
    i = 0
    for segment in segments:
        if not segment.samples:
            continue
        rid = segment.request.request_id
        drafts = segment.drafts
        if not drafts:
            sampled[rid] = tokens[i]
            i += 1
            continue
        targets = tokens[i:i + 1 + len(drafts)]
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
            accepted += 1
        produced[rid] = targets[:accepted + 1]
        i += 1 + len(drafts)
    return sampled, produced
