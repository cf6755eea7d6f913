"""Side by side: the silicon rows' and LLMServingSim's runs' errors under --cost gpu, kernels
and auto, with vLLM's terms before and after a fit (servelab.calibration.engine_fit)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servelab.calibration.engine_runs import Sample, run_samples, silicon_samples
from servelab.calibration.gpu_replay import METRICS, load_runs
from sim.cost.engine_overhead import EngineOverhead

SILICON_ROUNDS = 20  # as AIConfigurator's rows measured them (silicon_rows.MEASURED_ROUNDS)


def configs(before: EngineOverhead,
            after: EngineOverhead) -> list[tuple[str, str, EngineOverhead, bool]]:
    """(label, --cost, engine, whether the host overlaps by each run's version) per column:
    before, the host overlapped at every version, as priced until the terms were fitted."""
    return [("gpu", "gpu", before, False), ("gpu+new", "gpu", after, True),
            ("kern", "kernels", before, False), ("kern+new", "kernels", after, True),
            ("auto+new", "auto", after, True)]


def stats(errors: Sequence[float]) -> tuple[float, float]:
    """Signed median and p90 |error|."""
    a = np.asarray(errors, float)
    return float(np.median(a)), float(np.percentile(np.abs(a), 90))


def _cell(done: Sequence[Sample], metric: str) -> str:
    if not done:
        return f"{'-':>13}"
    med, p90 = stats([getattr(s, f"{metric}_error") for s in done])
    return f"{med:>+6.0%}/{p90:<5.0%} "


def silicon_table(columns: dict[str, list[Sample]], metric: str) -> list[str]:
    """Per (model, TP, precision) and overall: rows, then median/p90 |error| per column."""
    groups = sorted({s.group for done in columns.values() for s in done})
    lines = [f"{metric.upper():<40}{'rows':>5} " + "".join(f"{c:>13} " for c in columns)]
    for group in [*groups, None]:
        label = "all" if group is None else " ".join(str(g) for g in group)
        cells = {c: [s for s in done if group is None or s.group == group]
                 for c, done in columns.items()}
        rows = max(len(v) for v in cells.values())
        lines.append(f"{label[:40]:<40}{rows:>5} "
                     + "".join(_cell(v, metric) for v in cells.values()))
    return lines


def runs_table(columns: dict[str, list[Sample]]) -> list[str]:
    """Per run and summary metric: vLLM's value, each column's error, LLMServingSim's."""
    peers = {run.name: run for run in load_runs()}
    lines = [f"{'run':<36}{'metric':<14}{'vLLM':>9}" + "".join(f"{c:>10}" for c in columns)
             + f"{'LLMServingSim':>15}"]
    for name, run in peers.items():
        for key in METRICS.values():
            measured = run.vllm[key]
            cells = []
            for done in columns.values():
                ours = [s.summary[key] for s in done if s.name == name]
                cells.append(f"{(ours[0] - measured) / measured:>+10.1%}" if ours
                             else f"{'-':>10}")
            peer = (run.peer[key] - measured) / measured
            lines.append(f"{name:<36}{key:<14}{measured:>9.1f}" + "".join(cells)
                         + f"{peer:>+15.1%}")
    return lines


def report(before: EngineOverhead, after: EngineOverhead,
           rounds: int = SILICON_ROUNDS) -> str:
    """Both data sets under every column (each silicon row: `rounds` measured rounds)."""
    cols = configs(before, after)
    silicon = {label: silicon_samples(engine, cost, rounds, versioned)
               for label, cost, engine, versioned in cols}
    runs = {label: run_samples(engine, cost, versioned) for label, cost, engine, versioned in cols}
    out = ["AIConfigurator H100 vLLM runs: signed median / p90 |error| of mean TTFT and TPOT",
           *silicon_table(silicon, "ttft"), "", *silicon_table(silicon, "tpot"), "",
           "LLMServingSim's four vLLM runs: each summary metric's error", *runs_table(runs)]
    return "\n".join(out)
