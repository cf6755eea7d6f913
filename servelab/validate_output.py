"""What `servelab validate` prints and writes: error tables, step tables, charts."""

from __future__ import annotations

import statistics
from pathlib import Path

from sim.calibrated import STEP_KINDS
from sim.simulation import RunResult

# The metrics whose simulated value is checked against the measured one.
VALIDATED = ("output_throughput", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
             "median_itl_ms", "p99_itl_ms", "median_tpot_ms", "median_e2el_ms", "p99_e2el_ms")

def overall(results: dict) -> dict:
    """Median and largest |error| over every policy and metric, and the median spread."""
    errors = [abs(e) for r in results.values() for e in r["error"].values() if e is not None]
    spreads = [v for r in results.values() for v in r["spread"].values() if v is not None]
    return {"median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "median_spread": statistics.median(spreads) if spreads else None}


def format_overall(results: dict) -> str:
    o = overall(results)
    if o["median_abs_error"] is None:
        return "no metric could be compared"
    text = (f"median |error| {o['median_abs_error']:.1%}, "
            f"largest {o['max_abs_error']:.1%} over {len(results)} policies")
    if o["median_spread"]:
        text += (f"; measured runs of the same policy differed by {o['median_spread']:.1%} "
                 f"(median over metrics)")
    return text


def format_speeds(speeds: dict[str, list], window_s: float) -> str:
    """Each policy's runs' speeds (cmd_validate.RunSpeed: the grid's shapes timed during a
    run / their median), and the range of their windows'."""
    def windows(runs: list) -> str:
        factors = [factor for run in runs for _, factor in run.windows]
        return f" (windows {min(factors):.2f}-{max(factors):.2f})"

    return (f"how slow the machine ran during each measured run, simulated at its speed in "
            f"each {window_s:g} s of the run: "
            + "; ".join(f"{policy} " + " ".join(f"{run.overall:.2f}" for run in runs)
                        + windows(runs) for policy, runs in speeds.items()))


def format_errors(results: dict) -> str:
    """Rows of metrics; per policy the measured and simulated values and the signed error."""
    head = f"{'metric':<20}" + "".join(f"{p:>30}" for p in results)
    sub = f"{'':<20}" + "".join(f"{'measured':>11}{'simulated':>11}{'error':>8}"
                                for _ in results)
    lines = [head, sub]
    for key in VALIDATED:
        cells = []
        for r in results.values():
            m, s, e = r["measured"].get(key), r["simulated"].get(key), r["error"][key]
            cells.append(f"{_num(m):>11}{_num(s):>11}{'-' if e is None else f'{e:+.1%}':>8}")
        lines.append(f"{key:<20}" + "".join(cells))
    return "\n".join(lines)


def format_steps(results: dict) -> str:
    """Per step kind and policy: the median measured / predicted step time of the measured
    runs' steps, and the kind's share of their busy time."""
    if not any("steps" in r for r in results.values()):
        return ""
    lines = ["steps of the measured runs, measured / predicted (median; share of busy time)",
             f"{'':<24}" + "".join(f"{p:>18}" for p in results)]
    for kind in STEP_KINDS:
        cells = [r.get("steps", {}).get(kind) for r in results.values()]
        if any(cells):
            lines.append(f"{kind:<24}" + "".join(
                f"{'-':>18}" if c is None
                else f"{c['median_ratio']:>11.3f} ({c['time_share']:4.0%})" for c in cells))
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def write_out(out_dir: Path, title: str, results: dict,
               runs: dict[str, tuple[RunResult, RunResult]]) -> None:
    from sim.fidelity_charts import write_fidelity_charts

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"policy": p, "metric": k, "measured": r["measured"].get(k),
             "simulated": r["simulated"].get(k), "error": r["error"][k]}
            for p, r in results.items() for k in VALIDATED]
    import pandas as pd

    pd.DataFrame(rows).to_csv(out_dir / "fidelity_errors.csv", index=False)
    paths = write_fidelity_charts(results, runs, out_dir, title)
    print(f"wrote {len(paths)} charts and fidelity_errors.csv to {out_dir}")
