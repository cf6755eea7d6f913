"""Acceptance a measured run recorded, per request, for a simulation to draw from.

A run counts, for each request, its decoding rows that could speculate, the rows whose
proposer found proposals, and the proposals accepted at each position; and it lists the
request's drafts: at which output token each came, how many proposals, how many accepted.
Acceptance is rarely spread evenly: on a model whose greedy output loops, n-gram proposals
are accepted nearly always once a request loops and never found before, so a few requests
take most of the gain, each late in its output. Mean TPOT is a mean over requests, and
drawing every request at the run's average rate spreads that gain thin. A simulation
calibrated from the record replays each request's drafts at the output tokens where they
came (matched by request id; a greedy request's tokens, and so its drafts, do not depend on
the batch it runs in), draws a request that has only counters at its own rates, and prices
requests the run did not have at the run's totals.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class AcceptanceRecordError(ValueError):
    """A recorded run whose acceptance cannot be read, naming the file and what is wrong."""


@dataclass(frozen=True, slots=True)
class RequestCounts:
    """One request's speculation counters in a run (or the run's totals)."""

    num_decodes: int  # decoding rows that could speculate (drafted or not)
    num_drafts: int  # of those, rows that verified proposals
    accepted_per_pos: tuple[int, ...]  # accepted proposals by position, over the drafts
    # Each draft: (output tokens the request had, proposals verified, proposals accepted);
    # empty in a record that predates it (and in the run's totals).
    drafts: tuple[tuple[int, int, int], ...] = ()

    @property
    def draft_share(self) -> float:
        """The fraction of decoding rows whose proposer found proposals."""
        return self.num_drafts / self.num_decodes if self.num_decodes else 0.0

    @property
    def draft_rates(self) -> tuple[float, ...]:
        """Per position, the fraction of verifying rows whose proposal there was accepted."""
        drafts = self.num_drafts
        return tuple(n / drafts if drafts else 0.0 for n in self.accepted_per_pos)

    def as_record(self) -> dict[str, Any]:
        """As `servelab run --json` records it."""
        return {"num_decodes": self.num_decodes, "num_drafts": self.num_drafts,
                "accepted_per_pos": list(self.accepted_per_pos),
                "drafts": [list(draft) for draft in self.drafts]}


@dataclass(frozen=True)
class RecordedAcceptance:
    """A run's acceptance by request id, and its totals for requests it did not have."""

    source: str  # the file it was read from
    total: RequestCounts
    by_request: tuple[tuple[str, RequestCounts], ...]


def read_recorded(path: Path, num_positions: int) -> RecordedAcceptance | None:
    """The per-request acceptance of a `servelab run --speculative-config --json` file; None
    if the run predates the per-request record (then only its average rates are known)."""
    result = _speculative_result(path)
    record = result.get("spec_per_request")
    if record is None:
        return None
    try:
        counts = {str(rid): _counts(entry) for rid, entry in record.items()}
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise AcceptanceRecordError(f"acceptance_rates file {path}: spec_per_request is not "
                                    f"per-request counters ({exc})") from None
    wrong = [rid for rid, c in counts.items() if len(c.accepted_per_pos) != num_positions]
    if wrong:
        raise AcceptanceRecordError(
            f"acceptance_rates file {path}: request {wrong[0]} has "
            f"{len(counts[wrong[0]].accepted_per_pos)} positions, num_speculative_tokens is "
            f"{num_positions}")
    total = RequestCounts(
        sum(c.num_decodes for c in counts.values()), sum(c.num_drafts for c in counts.values()),
        tuple(sum(c.accepted_per_pos[i] for c in counts.values())
              for i in range(num_positions)))
    return RecordedAcceptance(str(path), total, tuple(sorted(counts.items())))


def rates_from_run(path: Path) -> list[float]:
    """The per-decode acceptance rates a `servelab run --speculative-config --json` file
    recorded (its one policy's `spec_acceptance_rates_per_decode`)."""
    return list(_speculative_result(path)["spec_acceptance_rates_per_decode"])


def _speculative_result(path: Path) -> dict[str, Any]:
    """The one policy result of a run's --json file that records speculation."""
    try:
        results = json.loads(path.read_text())["results"]
        found = [r for r in results.values()
                 if isinstance(r, dict) and "spec_acceptance_rates_per_decode" in r]
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise AcceptanceRecordError(
            f"acceptance_rates file {path}: not a run's --json output ({exc})") from None
    if len(found) != 1:
        raise AcceptanceRecordError(
            f"acceptance_rates file {path}: needs one result with "
            f"spec_acceptance_rates_per_decode, found {len(found)}")
    return found[0]


def _counts(entry: dict[str, Any]) -> RequestCounts:
    drafts = tuple((int(index), int(k), int(accepted))
                   for index, k, accepted in entry.get("drafts", ()))
    counts = RequestCounts(int(entry["num_decodes"]), int(entry["num_drafts"]),
                           tuple(int(n) for n in entry["accepted_per_pos"]), drafts)
    if not 0 <= counts.num_drafts <= counts.num_decodes or any(
            not 0 <= n <= counts.num_drafts for n in counts.accepted_per_pos):
        raise ValueError(f"counts out of range: {entry}")
    positions = len(counts.accepted_per_pos)
    if drafts and (len(drafts) != counts.num_drafts or any(
            index < 0 or not 0 <= accepted <= k <= positions or k < 1
            for index, k, accepted in drafts)):
        raise ValueError(f"drafts do not match the counts: {entry}")
    return counts
