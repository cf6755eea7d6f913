"""What a run with speculation reports beside its summary: vLLM's spec-decode counters and
the speedup against the same run without speculation."""

from __future__ import annotations

from sim.engine.speculation.config import SpeculativeConfig
from sim.engine.speculation.speculator import Speculator


def speedups(spec: dict, plain: dict) -> dict[str, float]:
    """Over the plain run's summary: mean TPOT (plain / speculative, > 1 is faster) and
    output throughput (speculative / plain); 0 where a run has none."""
    tpot, plain_tpot = spec.get("mean_tpot_ms"), plain.get("mean_tpot_ms")
    thr, plain_thr = spec.get("output_throughput"), plain.get("output_throughput")
    return {"spec_tpot_speedup": plain_tpot / tpot if tpot and plain_tpot else 0.0,
            "spec_throughput_speedup": thr / plain_thr if thr and plain_thr else 0.0}


def speculation_summary(speculator: Speculator, spec: dict, plain: dict) -> dict:
    """The counted acceptance rate and mean accepted length, the speedups, and each
    request's counters (`spec_per_request`, what a simulation calibrates from)."""
    return {**speculator.metrics(), **speedups(spec, plain),
            "spec_per_request": speculator.per_request()}


def configured_summary(config: SpeculativeConfig, spec: dict, plain: dict) -> dict[str, float]:
    """Simulation: the acceptance its rate vector implies (a verifying row accepts
    sum(rates) proposals on average), and the speedups."""
    rates = config.acceptance_rates
    accepted = sum(rates)
    return {"spec_acceptance_rate": accepted / len(rates) if rates else 0.0,
            "spec_mean_accepted_length": 1.0 + accepted, **speedups(spec, plain)}


def format_speculation(record: dict[str, float]) -> str:
    """One human line for the summary."""
    return (f"speculation: acceptance rate {record['spec_acceptance_rate']:.3f}, mean accepted "
            f"length {record['spec_mean_accepted_length']:.2f} tokens; speedup over no "
            f"speculation: TPOT x{record['spec_tpot_speedup']:.2f}, output throughput "
            f"x{record['spec_throughput_speedup']:.2f}")
