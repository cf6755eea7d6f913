"""The speculative-decoding configuration, read from vLLM's `--speculative-config` JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sim.engine.speculation.acceptance import (
    AcceptanceRecordError,
    RecordedAcceptance,
    rates_from_run,
    read_recorded,
)

# Methods the scheduler accepts; which of them a backend can run or price is its own check.
METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp")
# Methods whose proposals come from a drafter's forward passes (not a lookup): a backend
# runs them (the executor's draft model) or prices them (sim.cost.drafter).
DRAFTER_METHODS = ("draft_model", "eagle", "eagle3", "mtp")
# Fields that are not `--speculative-config` keys: set by the composition, never by JSON.
_INTERNAL = ("drafter_priced", "recorded")


class SpeculativeConfigError(ValueError):
    """A `--speculative-config` that cannot be used, with the key at fault."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """What a step proposes per decoding row and how proposals are found (vLLM's names)."""

    method: str = "ngram"
    num_speculative_tokens: int = 4  # k: most proposals one row verifies per step
    prompt_lookup_min: int = 2  # n-gram: shortest suffix looked up in the sequence
    prompt_lookup_max: int = 4  # n-gram: longest suffix looked up
    # draft_model: the drafter, a preset or a checkpoint directory on the executor, a preset
    # or Hugging Face id in simulation; or, instead, draft_num_layers: the target's own first
    # N layers (with its embedding, final norm and LM head) as the drafter.
    model: str | None = None
    draft_num_layers: int | None = None
    # Simulation on a calibrated cost model: the drafter's own calibration file (`servelab
    # calibrate --model DRAFTER`), which prices its forward passes.
    draft_cost_model: str | None = None
    # Simulation without a drafter's tokens: the fraction of decoding rows whose proposal i
    # (from 0) is accepted, non-increasing; in the JSON, a list or the path of a
    # `servelab run --json` file whose measured rates to use.
    acceptance_rates: tuple[float, ...] = ()
    # Not a JSON key: set by a composition whose cost model adds the drafter's forward passes
    # to each step (sim.cost.drafter), without which a simulation refuses a drafter method.
    drafter_priced: bool = False
    # Not a JSON key: set when acceptance_rates names a run that recorded acceptance per
    # request; a simulation then draws each request at its own rates (acceptance.py).
    recorded: RecordedAcceptance | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpeculativeConfigError(
                f"speculative method {self.method!r}: choose from {', '.join(METHODS)}")
        if self.num_speculative_tokens < 1:
            raise SpeculativeConfigError(
                f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise SpeculativeConfigError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min} and {self.prompt_lookup_max}")
        self._check_rates()
        self._check_drafter()

    def _check_drafter(self) -> None:
        layers = self.draft_num_layers
        if layers is not None and self.method != "draft_model":
            raise SpeculativeConfigError(
                f"draft_num_layers is for method draft_model, not {self.method!r}")
        if layers is not None and layers < 1:
            raise SpeculativeConfigError(f"draft_num_layers must be >= 1, got {layers}")
        if self.method == "draft_model" and (self.model is None) == (layers is None):
            raise SpeculativeConfigError(
                "method draft_model needs one of \"model\" (the drafter) or "
                "\"draft_num_layers\" (the target's first N layers)")

    def _check_rates(self) -> None:
        rates = self.acceptance_rates
        if rates and len(rates) != self.num_speculative_tokens:
            raise SpeculativeConfigError(
                f"acceptance_rates has {len(rates)} entries, num_speculative_tokens is "
                f"{self.num_speculative_tokens}")
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise SpeculativeConfigError(f"acceptance_rates must lie in [0, 1], got {rates}")
        if any(b > a for a, b in zip(rates, rates[1:], strict=False)):
            raise SpeculativeConfigError(
                f"acceptance_rates must not increase (a proposal is accepted only after all "
                f"before it), got {rates}")

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        """Parse `--speculative-config` JSON; unknown keys are an error, not ignored."""
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpeculativeConfigError(f"--speculative-config is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise SpeculativeConfigError("--speculative-config must be a JSON object")
        known = {f.name for f in fields(cls)} - set(_INTERNAL)
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpeculativeConfigError(
                f"--speculative-config: unknown keys {unknown}; known: {sorted(known)}")
        rates = data.get("acceptance_rates")
        if isinstance(rates, str):  # a recorded run calibrates the simulation
            data["recorded"] = _recorded(Path(rates), data)
            rates = _run_rates(Path(rates))
        if rates is not None:
            data["acceptance_rates"] = tuple(float(r) for r in rates)
        return cls(**data)

    def as_record(self) -> dict[str, Any]:
        """The config as `--json` records it."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in _INTERNAL}


def _run_rates(path: Path) -> list[float]:
    try:
        return rates_from_run(path)
    except AcceptanceRecordError as exc:
        raise SpeculativeConfigError(str(exc)) from None


def _recorded(path: Path, data: dict[str, Any]) -> RecordedAcceptance | None:
    k = data.get("num_speculative_tokens", SpeculativeConfig.num_speculative_tokens)
    try:
        return read_recorded(path, int(k))
    except AcceptanceRecordError as exc:
        raise SpeculativeConfigError(str(exc)) from None
