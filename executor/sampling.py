"""Token sampling: greedy, temperature, top-k, top-p, with one torch.Generator per request.

The generator is reseeded for every token from (request seed, output index), so a request's
random stream depends only on itself: not on batch composition, step order or preemption.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sim.engine.core import Request, SamplingParams, token_seed

# A temperature below this is greedy, as in vLLM: dividing logits by a tiny one overflows
# float32 to inf, softmax turns the infs into NaN, and the draw returns the last token id.
GREEDY_BELOW_TEMPERATURE = 1e-5


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Index of each row's maximum (the first on ties); numpy's SIMD argmax on CPU is ~15x
    faster than torch's for [B, vocab]."""
    if logits.device.type == "cpu":
        return logits.contiguous().numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def is_greedy(params: SamplingParams) -> bool:
    """Whether the request takes each row's argmax (no random draw)."""
    return params.temperature < GREEDY_BELOW_TEMPERATURE or params.top_k == 1


def _tempered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Softmax of logits [vocab] at the temperature, outside the top-k masked off."""
    x = logits / params.temperature
    if 0 < params.top_k < x.shape[0]:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    return torch.softmax(x, dim=-1)


def sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Draw one token from logits [vocab] (float32) by inverse CDF with one uniform."""
    vocab = logits.shape[0]
    probs = _tempered_probs(logits, params)
    u = torch.rand((), generator=generator, device=logits.device, dtype=torch.float32)
    if params.top_p < 1.0:
        # Keep the smallest head of the sorted distribution whose mass reaches top_p.
        probs, order = probs.sort(descending=True, stable=True)
        keep = (probs.cumsum(0) - probs) < params.top_p
        probs = probs * keep
    else:
        order = None
    cdf = probs.cumsum(0)
    pick = torch.searchsorted(cdf, u * cdf[-1], right=True).clamp_(max=vocab - 1)
    return int(pick if order is None else order[pick])


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution sample_row draws from, over the whole vocabulary [vocab]."""
    probs = _tempered_probs(logits, params)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True, stable=True)
        keep = (sorted_probs.cumsum(0) - sorted_probs) < params.top_p
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs * keep)
    return probs / probs.sum()


class Sampler:
    """Samples the next token of each row; one reseeded generator per live request.

    `allowed_token_ids` (None: all) limits every draw to those ids, as vLLM's
    allowed_token_ids does for one request: random weights then emit only text that
    re-encodes to the ids sampled (servelab/serve/simulated.py).
    """

    def __init__(self, device: torch.device | str = "cpu",
                 allowed_token_ids: Sequence[int] | None = None) -> None:
        self.device = torch.device(device)
        self._generators: dict[str, torch.Generator] = {}
        self._allowed = None if allowed_token_ids is None else list(allowed_token_ids)
        self._mask: torch.Tensor | None = None  # [vocab]: 0 where allowed, -inf elsewhere

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """Tokens for logits [S, vocab], row i belonging to requests[i]."""
        if self._allowed is not None:
            logits = logits + self._mask_of(logits)
        tokens = [0] * len(requests)
        greedy = [i for i, r in enumerate(requests) if is_greedy(r.sampling)]
        if greedy:
            rows = logits if len(greedy) == len(requests) else logits[greedy]
            for i, token in zip(greedy, argmax_rows(rows), strict=True):
                tokens[i] = token
        for i, request in enumerate(requests):
            if not is_greedy(request.sampling):
                tokens[i] = sample_row(logits[i].float(), request.sampling, self._seeded(request))
        return tokens

    def verify(self, logits: torch.Tensor, request: Request, drafts: list[int]) -> list[int]:
        """A verifying row's tokens from its logits [k + 1, vocab]: its accepted proposals,
        then the token after them. Greedy: proposals are accepted while they equal the
        argmax. Sampling: rejection sampling against a one-token proposal, which keeps the
        target distribution (accept d with probability p(d), else draw from p without d),
        each position drawing from its own output index's generator seed."""
        if self._allowed is not None:
            logits = logits + self._mask_of(logits)
        if is_greedy(request.sampling):
            targets = argmax_rows(logits)
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
                accepted += 1
            return targets[:accepted + 1]
        return self._rejection_sample(logits, request, drafts)

    def _rejection_sample(self, logits: torch.Tensor, request: Request,
                          drafts: list[int]) -> list[int]:
        params = request.sampling
        start = len(request.output_token_ids)
        tokens: list[int] = []
        for i, draft in enumerate(drafts):
            generator = self._seeded(request, start + i)
            probs = target_probs(logits[i].float(), params)
            u = torch.rand((), generator=generator, device=probs.device, dtype=torch.float32)
            if u < probs[draft]:
                tokens.append(draft)
                continue
            probs[draft] = 0.0  # the residual max(p - q, 0) of a one-token proposal q
            cdf = probs.cumsum(0)
            v = torch.rand((), generator=generator, device=probs.device, dtype=torch.float32)
            pick = torch.searchsorted(cdf, v * cdf[-1], right=True).clamp_(max=len(cdf) - 1)
            return [*tokens, int(pick)]
        generator = self._seeded(request, start + len(drafts))
        return [*tokens, sample_row(logits[len(drafts)].float(), params, generator)]

    def _mask_of(self, logits: torch.Tensor) -> torch.Tensor:
        if self._mask is None or self._mask.shape[0] != logits.shape[-1]:
            mask = torch.full((logits.shape[-1],), float("-inf"), device=logits.device)
            mask[self._allowed] = 0.0
            self._mask = mask
        return self._mask.to(logits.dtype)

    def _seeded(self, request: Request, index: int | None = None) -> torch.Generator:
        """The request's generator, seeded for output token `index` (default: the next)."""
        generator = self._generators.get(request.request_id)
        if generator is None:
            generator = self._generators[request.request_id] = torch.Generator(self.device)
        if index is None:
            index = len(request.output_token_ids)  # which output token this draw produces
        return generator.manual_seed(token_seed(request.sampling.seed, index))

    def free(self, request_id: str) -> None:
        """Forget a request's generator (it finished or was aborted)."""
        self._generators.pop(request_id, None)
