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
from sim.engine.speculation.acceptance import RequestCounts
from sim.engine.speculation.config import SpeculativeConfig
from sim.engine.speculation.ngram import propose_ngram

_SEED_SCALE = 2.0 ** -63  # token_seed gives 63 bits: a uniform in [0, 1)
# Whether a recorded request's proposer finds proposals is drawn from a stream of its own,
# so it does not correlate with how many are accepted.
_DRAFT_SALT = 0x2545F4914F6CDD1D


class _Counts:
    """One request's counters as the run goes (RequestCounts once recorded)."""

    __slots__ = ("num_decodes", "num_drafts", "accepted_per_pos", "drafts")

    def __init__(self, k: int) -> None:
        self.num_decodes = 0
        self.num_drafts = 0
        self.accepted_per_pos = [0] * k
        self.drafts: list[tuple[int, int, int]] = []  # (output tokens, proposals, accepted)


class _Recorded(NamedTuple):
    """A recorded request's share of decoding rows that drafted, and its acceptance rates by
    position over those drafts (acceptance.RequestCounts' draft_share and draft_rates); and,
    where the record lists them, its drafts by the output tokens it had: (proposals,
    accepted), replayed instead of drawn."""

    draft_share: float
    draft_rates: tuple[float, ...]
    drafts: dict[int, tuple[int, int]] | None = None


def _recorded(counts: RequestCounts) -> _Recorded:
    drafts = ({index: (k, accepted) for index, k, accepted in counts.drafts}
              if counts.drafts else None)
    return _Recorded(counts.draft_share, counts.draft_rates, drafts)


class Draft(NamedTuple):
    """A row's proposals for one step."""

    num_tokens: int  # proposals to verify (0: a plain decode)
    token_ids: tuple[int, ...]  # their ids; empty in pure simulation (no token ids)


class Speculator:
    """Proposals for decoding rows and the acceptance of verified ones."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self._rates = config.acceptance_rates
        recorded = config.recorded
        # A recorded run's (draft share, acceptance rates over its drafts), per request id
        # and in total (for requests it lacks): derived once, read every verifying row.
        self._recorded: dict[str, _Recorded] | None = None
        self._recorded_total: _Recorded | None = None
        if recorded is not None:
            self._recorded = {rid: _recorded(c) for rid, c in recorded.by_request}
            self._recorded_total = _recorded(recorded.total)
        # Each request's counters, kept only when asked (a run that records them): a server
        # that runs for days would otherwise keep one entry per request it ever served.
        self.record_requests = False
        self._per_request: dict[str, _Counts] = {}
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
            k = self._drawn_proposals(request, k)
            if not k:
                self._undrafted(request)
            return Draft(k, ())
        if method != "ngram":  # the backend's drafter fills in the k proposals' ids
            return Draft(k, ())
        ids = propose_ngram(request.token_ids(), k, self.config.prompt_lookup_min,
                            self.config.prompt_lookup_max)
        if not ids:
            self._undrafted(request)
        return Draft(len(ids), tuple(ids))

    def _recorded_counts(self, request: Request) -> _Recorded | None:
        """The recorded run's rates of this request (its totals if it lacks the request);
        None without a record."""
        if self._recorded is None:
            return None
        return self._recorded.get(request.request_id, self._recorded_total)

    def _drawn_proposals(self, request: Request, k: int) -> int:
        """Simulation: how many of at most k proposals the row's proposer finds this step (0:
        none). k without a record (acceptance_rates then count every decoding row); with a
        record that lists the request's drafts, the draft it made at this output token (none
        if it made none there); with the request's counters only, k at the share of its
        decoding rows that drafted, one uniform seeded by the request and its output index."""
        counts = self._recorded_counts(request)
        if counts is None:
            return k
        if counts.drafts is not None:
            draft = counts.drafts.get(request.num_output_tokens)
            return 0 if draft is None else min(k, draft[0])
        u = token_seed(_request_seed(request) ^ _DRAFT_SALT,
                       request.num_output_tokens) * _SEED_SCALE
        return k if u < counts.draft_share else 0

    def draw_accepted(self, request: Request, k: int) -> int:
        """Simulation: accepted proposals of a k-proposal row: the recorded draft's at this
        output token where the record lists the request's drafts; else one uniform seeded by
        the request and its output index (batch-independent) against the acceptance rates:
        the recorded run's rates of this request over its drafts if there is a record, else
        acceptance_rates."""
        counts = self._recorded_counts(request)
        if counts is not None and counts.drafts is not None:
            draft = counts.drafts.get(request.num_output_tokens)
            if draft is not None:
                return min(k, draft[1])
        rates = self._rates if counts is None else counts.draft_rates
        if not rates:
            raise ValueError("simulating speculative decoding needs acceptance_rates in "
                             "--speculative-config (no model verifies the proposals)")
        u = token_seed(_request_seed(request), request.num_output_tokens) * _SEED_SCALE
        accepted = 0
        while accepted < k and u < rates[accepted]:
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
            index = request.num_output_tokens
            if sampled is None:
                accepted = self.draw_accepted(request, k)
            else:
                accepted = _take_tokens(request, produced[request.request_id], sampled)
            request.token_times_s.extend([now] * accepted)
            request.num_computed_tokens -= k - accepted
            self._count(request.request_id, k, accepted, index)

    def release_lookahead(self, plan: BatchPlan, block_manager: BlockManager) -> None:
        """After the step's tokens: free the blocks a verified row took for proposals that
        were rejected; it keeps those of its computed tokens, as a row that decoded one token
        at a time would (a row that finished has freed all of its blocks already)."""
        for request in plan.requests:
            if (request.request_id in plan.num_spec_tokens
                    and request.status is RequestStatus.RUNNING):
                block_manager.shrink(request.request_id, request.num_computed_tokens)

    def _undrafted(self, request: Request) -> None:
        self.num_undrafted += 1
        if self.record_requests:
            self._counts(request.request_id).num_decodes += 1

    def _counts(self, request_id: str) -> _Counts:
        counts = self._per_request.get(request_id)
        if counts is None:
            counts = self._per_request[request_id] = _Counts(self.config.num_speculative_tokens)
        return counts

    def _count(self, request_id: str, k: int, accepted: int, index: int) -> None:
        """Count a verified row of `request_id` that had `index` output tokens."""
        if self.record_requests:
            counts = self._counts(request_id)
            counts.num_decodes += 1
            counts.num_drafts += 1
            for i in range(accepted):
                counts.accepted_per_pos[i] += 1
            counts.drafts.append((index, k, accepted))
        self.num_drafts += 1
        self.num_draft_tokens += k
        self.num_accepted_tokens += accepted
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    def per_request(self) -> dict[str, dict]:
        """Each request's counters (acceptance.RequestCounts records), by request id, if
        record_requests was on: what a simulation calibrated from this run draws from."""
        return {rid: RequestCounts(c.num_decodes, c.num_drafts, tuple(c.accepted_per_pos),
                                   tuple(c.drafts)).as_record()
                for rid, c in sorted(self._per_request.items())}

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


def _request_seed(request: Request) -> int:
    """The request's own seed for acceptance draws (its sampling seed and its id)."""
    return request.sampling.seed ^ zlib.crc32(request.request_id.encode())


def _take_tokens(request: Request, tokens: list[int], sampled: dict[str, int]) -> int:
    """A real backend's verified row: append its accepted proposals (up to the first that
    ends the request) and leave the token after them in `sampled`; the number appended."""
    stops = request.sampling.stops
    end = next((i for i, t in enumerate(tokens) if stops(t)), len(tokens) - 1)
    request.output_token_ids.extend(tokens[:end])
    sampled[request.request_id] = tokens[end]
    return end
