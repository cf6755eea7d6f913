"""What a run with speculation reports beside its summary: vLLM's spec-decode counters and
the speedup against the same run without speculation."""

from __future__ import annotations

from sim.engine.speculation.speculator import Speculator


def speculation_summary(speculator: Speculator, spec: dict, plain: dict) -> dict[str, float]:
    """Acceptance rate, mean accepted length, and speedups over the plain run's summary:
    mean TPOT (plain / speculative, > 1 is faster) and output throughput (speculative /
    plain)."""
    record = dict(speculator.metrics())
    tpot, plain_tpot = spec.get("mean_tpot_ms"), plain.get("mean_tpot_ms")
    record["spec_tpot_speedup"] = plain_tpot / tpot if tpot and plain_tpot else 0.0
    thr, plain_thr = spec.get("output_throughput"), plain.get("output_throughput")
    record["spec_throughput_speedup"] = thr / plain_thr if thr and plain_thr else 0.0
    return record


def format_speculation(record: dict[str, float]) -> str:
    """One human line for the summary."""
    return (f"speculation: acceptance rate {record['spec_acceptance_rate']:.3f}, mean accepted "
            f"length {record['spec_mean_accepted_length']:.2f} tokens, {record['spec_num_drafts']}"
            f" verifying rows; speedup over no speculation: TPOT x"
            f"{record['spec_tpot_speedup']:.2f}, output throughput x"
            f"{record['spec_throughput_speedup']:.2f}")
