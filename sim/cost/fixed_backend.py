"""A constant-time backend: a small real fake for tests and quick experiments."""

from __future__ import annotations

from dataclasses import dataclass

from sim.engine.core import BatchPlan, Request, StepResult


@dataclass(frozen=True)
class ConstantBackend:
    """Each step costs step_s plus per_token_s per computed token; samples nothing."""

    step_s: float = 0.01
    per_token_s: float = 0.0
    reads_rows = False  # (not a field) a step's time needs only the plan's totals

    def __post_init__(self) -> None:
        if self.step_s < 0 or self.per_token_s < 0:
            raise ValueError("step_s and per_token_s must be >= 0")

    def execute(self, plan: BatchPlan) -> StepResult:
        return StepResult(self.step_s + self.per_token_s * plan.num_tokens)

    def free(self, request: Request) -> None:
        """Nothing to forget."""
