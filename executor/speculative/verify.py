"""Verification of proposals: a verifying row's logits rows go to the sampler's verify
(greedy: accepted while equal to the argmax, so the row produces exactly what one-token
decoding would; sampling: rejection sampling, which keeps the target distribution); the
other rows are sampled together as in a step without proposals."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from executor.batch import Segment
from executor.sampling import Sampler, sample_row, target_probs
from sim.engine.core import Request, token_seed


def sample_and_verify(sampler: Sampler, logits: torch.Tensor, segments: list[Segment],
                      proposal_probs: Mapping[str, torch.Tensor] | None = None
                      ) -> tuple[dict[str, int], dict[str, list[int]]]:
    """From a step's logits [S, vocab] (one row per sampling sequence, 1 + k per verifying
    one, in segment order): the plain rows' tokens, and each verifying row's produced tokens
    (its accepted proposals, then the token after them). proposal_probs: a drafter's q
    [k, vocab] of each sampling row it drew proposals for (else a proposal is one-hot)."""
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
            rid = segment.request.request_id
            q = proposal_probs.get(rid) if proposal_probs else None
            produced[rid] = (sampler.verify(rows, segment.request, drafts) if q is None
                             else rejection_sample(rows, segment.request, drafts, q))
        else:
            plain_rows.append(row)
            plain.append(segment.request)
        row += 1 + len(drafts)
    tokens = sampler.sample(logits[plain_rows], plain) if plain else []
    return {r.request_id: t for r, t in zip(plain, tokens, strict=True)}, produced


def rejection_sample(logits: torch.Tensor, request: Request, drafts: list[int],
                     q: torch.Tensor) -> list[int]:
    """Verify proposals drawn from q [k, vocab] against the target's logits [k + 1, vocab]:
    proposal d at position i is accepted with probability min(1, p(d) / q(d)), else the
    token is drawn from the residual norm(max(0, p - q)) and the row ends; after k accepted
    proposals the next token is drawn from p. The result is distributed as p at every
    position (Leviathan et al., 2023). Position i draws from the target's generator seeded
    by its own output index, as the sampler does."""
    params = request.sampling
    start = len(request.output_token_ids)
    tokens: list[int] = []
    for i, draft in enumerate(drafts):
        generator = _seeded(request, start + i, logits.device)
        p = target_probs(logits[i].float(), params)
        u = torch.rand((), generator=generator, device=p.device, dtype=torch.float32)
        if u * q[i, draft] < p[draft]:  # u < p / q without dividing by a tiny q
            tokens.append(draft)
            continue
        residual = (p - q[i]).clamp_(min=0.0)
        cdf = residual.cumsum(0)
        v = torch.rand((), generator=generator, device=p.device, dtype=torch.float32)
        pick = torch.searchsorted(cdf, v * cdf[-1], right=True).clamp_(max=len(cdf) - 1)
        return [*tokens, int(pick)]
    generator = _seeded(request, start + len(drafts), logits.device)
    return [*tokens, sample_row(logits[len(drafts)].float(), params, generator)]


def _seeded(request: Request, index: int, device: torch.device) -> torch.Generator:
    """A generator seeded as the sampler seeds the request's output token `index`."""
    return torch.Generator(device).manual_seed(token_seed(request.sampling.seed, index))
