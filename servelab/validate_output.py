"""What `servelab validate` prints: error tables, machine speeds, step tables."""

from __future__ import annotations

from executor.calibration.validation import STEP_KINDS, VALIDATED, overall


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


def format_speeds(speeds: dict[str, list[float]]) -> str:
    """Each policy's runs' speeds: the grid's shapes timed during a run over their medians."""
    return ("how slow the machine ran during each measured run (each simulated at its "
            "speed): " + "; ".join(f"{policy} " + " ".join(f"{speed:.2f}" for speed in runs)
                                   for policy, runs in speeds.items()))


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
