"""The scheduler's speculation part: proposes tokens for decoding rows, settles what a
verifying step accepted (the rest rolled back), and counts as vLLM's spec-decode metrics do.

A row that decodes with k proposals computes k + 1 tokens in one chunk: its last token and
the proposals. The target model's token after each position decides: proposals are accepted
while they equal it, so the row gains the a accepted proposals and the token after them,
1 + a tokens, exactly the tokens greedy decoding would have produced one step at a time. The
KV of the k - a rejected positions is rolled back (num_computed_tokens lowered by k - a).
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, Request, RequestStatus, StepResult, token_seed
from sim.engine.speculation.config import SpeculativeConfig
from sim.engine.speculation.ngram import propose_ngram

_SEED_SCALE = 2.0 ** -63  # token_seed gives 63 bits: a uniform in [0, 1)


class Draft(NamedTuple):
    """A row's proposals for one step."""

    num_tokens: int  # proposals to verify (0: a plain decode)
    token_ids: tuple[int, ...]  # their ids; empty in pure simulation (no token ids)


class Speculator:
    """Proposals for decoding rows and the acceptance of verified ones."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self._rates = config.acceptance_rates
        # vLLM's spec-decode counters: verifying rows, proposals, accepted proposals, and
        # accepted proposals by position.
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * config.num_speculative_tokens
        # Decoding rows that could have verified proposals but the proposer found none: a
        # simulation proposes for every decoding row, so its acceptance_rates count these.
        self.num_undrafted = 0

    def propose(self, request: Request, limit: int) -> Draft:
        """At most `limit` proposals for a decoding row (it has one token left to compute)."""
        k = min(self.config.num_speculative_tokens, limit)
        if k < 1:
            return Draft(0, ())
        method = self.config.method
        if request.prompt_token_ids is None:  # pure simulation: acceptance is drawn
            if method != "ngram" and not self.config.drafter_priced:
                raise ValueError(f"speculative method {method!r}: this cost model does not "
                                 "price its drafter's forward passes (servelab simulate "
                                 "does); simulate ngram here")
            return Draft(k, ())
        if method != "ngram":  # the backend's drafter fills in the k proposals' ids
            return Draft(k, ())
        ids = propose_ngram(request.token_ids(), k, self.config.prompt_lookup_min,
                            self.config.prompt_lookup_max)
        if not ids:
            self.num_undrafted += 1
        return Draft(len(ids), tuple(ids))

    def draw_accepted(self, request: Request, k: int) -> int:
        """Simulation: accepted proposals of a k-proposal row, from the acceptance rates with
        one uniform seeded by the request and its output index (batch-independent)."""
        if not self._rates:
            raise ValueError("simulating speculative decoding needs acceptance_rates in "
                             "--speculative-config (no model verifies the proposals)")
        seed = request.sampling.seed ^ zlib.crc32(request.request_id.encode())
        u = token_seed(seed, request.num_output_tokens) * _SEED_SCALE
        accepted = 0
        while accepted < k and u < self._rates[accepted]:
            accepted += 1
        return accepted

    def settle(self, plan: BatchPlan, result: StepResult, now: float) -> None:
        """Before the step's tokens are counted: each verified row's accepted proposals join
        its output (stamped `now`) and its rejected ones are rolled back; the scheduler's own
        update then counts the token after them as it counts a decode's."""
        spec = plan.num_spec_tokens
        sampled, produced = result.sampled_token_ids, result.spec_token_ids
        for request in plan.requests:
            k = spec.get(request.request_id)
            if k is None:
                continue
            if sampled is None:
                accepted = self.draw_accepted(request, k)
            else:
                accepted = _take_tokens(request, produced[request.request_id], sampled)
            request.token_times_s.extend([now] * accepted)
            request.num_computed_tokens -= k - accepted
            self._count(k, accepted)

    def release_lookahead(self, plan: BatchPlan, block_manager: BlockManager) -> None:
        """After the step's tokens: free the blocks a verified row took for proposals that
        were rejected; it keeps those of its computed tokens, as a row that decoded one token
        at a time would (a row that finished has freed all of its blocks already)."""
        for request in plan.requests:
            if (request.request_id in plan.num_spec_tokens
                    and request.status is RequestStatus.RUNNING):
                block_manager.shrink(request.request_id, request.num_computed_tokens)

    def _count(self, k: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += k
        self.num_accepted_tokens += accepted
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    def metrics(self) -> dict[str, float | list[float]]:
        """Acceptance rate (accepted / proposed) and mean accepted length (tokens per
        verifying row and step, the token after the proposals included), as vLLM reports."""
        drafts = self.num_drafts
        return {
            "spec_num_drafts": drafts,
            "spec_num_draft_tokens": self.num_draft_tokens,
            "spec_num_accepted_tokens": self.num_accepted_tokens,
            "spec_acceptance_rate": (self.num_accepted_tokens / self.num_draft_tokens
                                     if self.num_draft_tokens else 0.0),
            "spec_mean_accepted_length": (1.0 + self.num_accepted_tokens / drafts
                                          if drafts else 0.0),
            # Per position, as vLLM counts them: over the rows that verified proposals.
            "spec_acceptance_rates": [n / drafts if drafts else 0.0
                                      for n in self.accepted_per_pos],
            # Per position over every decoding row that could speculate, proposals found or
            # not: what a simulation's acceptance_rates mean, to calibrate one from this run.
            "spec_acceptance_rates_per_decode": [
                n / (drafts + self.num_undrafted) if drafts else 0.0
                for n in self.accepted_per_pos],
        }


def _take_tokens(request: Request, tokens: list[int], sampled: dict[str, int]) -> int:
    """A real backend's verified row: append its accepted proposals (up to the first that
    ends the request) and leave the token after them in `sampled`; the number appended."""
    stops = request.sampling.stops
    end = next((i for i, t in enumerate(tokens) if stops(t)), len(tokens) - 1)
    request.output_token_ids.extend(tokens[:end])
    sampled[request.request_id] = tokens[end]
    return end
