"""Charts of simulator fidelity: measured vs simulated CDFs and the signed error per metric.

"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from executor.calibration.validation import VALIDATED
from sim.replay.metrics import inter_token_latencies_ms, request_table
from sim.replay.simulation import RunResult


def _cdf(ax, values: np.ndarray, label: str, style: str, color: str) -> None:
    values = np.sort(values[np.isfinite(values) & (values > 0)])
    if values.size:
        ax.plot(values, np.arange(1, values.size + 1) / values.size, style, color=color,
                label=label)


def _completed_ttft(run: RunResult) -> np.ndarray:
    table = request_table(run.requests)
    return table.loc[table["finish_reason"].isin(["length", "stop"]), "ttft_ms"].to_numpy()


def cdf_overlay(runs: dict[str, tuple[RunResult, RunResult]], out_dir: Path,
                title: str) -> Path:
    """TTFT and ITL CDFs per policy, measured solid and simulated dashed."""
    fig = Figure(figsize=(6 * len(runs), 8), layout="constrained")
    axes = fig.subplots(2, len(runs), squeeze=False)
    for col, (policy, (measured, simulated)) in enumerate(runs.items()):
        for row, (name, values) in enumerate((("TTFT", _completed_ttft),
                                             ("ITL", inter_token_latencies_ms))):
            ax = axes[row, col]
            _cdf(ax, values(measured) if name == "TTFT" else values(measured.requests),
                 "measured", "-", "C0")
            _cdf(ax, values(simulated) if name == "TTFT" else values(simulated.requests),
                 "simulated", "--", "C1")
            ax.set_xscale("log")
            ax.set_xlabel(f"{name} (ms, log)")
            ax.set_ylabel("fraction of requests" if name == "TTFT" else "fraction of gaps")
            ax.set_title(f"{policy}: {name}")
            ax.grid(alpha=0.3)
            ax.legend(loc="lower right")
    fig.suptitle(f"{_cdf_finding(runs)}\n{title}")
    path = out_dir / "fidelity_cdf.png"
    fig.savefig(path, dpi=110)
    return path


def _cdf_finding(runs: dict[str, tuple[RunResult, RunResult]]) -> str:
    """The worst gap between measured and simulated medians, over policies."""
    worst = {}
    for name, values in (("TTFT", _completed_ttft),
                         ("ITL", lambda run: inter_token_latencies_ms(run.requests))):
        gaps = []
        for measured, simulated in runs.values():
            m, s = np.nanmedian(values(measured)), np.nanmedian(values(simulated))
            gaps.append(abs(s - m) / m if m > 0 else np.nan)
        worst[name] = np.nanmax(gaps) if np.isfinite(gaps).any() else np.nan
    return (f"Simulated (dashed) vs measured (solid) latency CDFs: medians differ by at most "
            f"{worst['TTFT']:.0%} (TTFT) and {worst['ITL']:.0%} (ITL) across policies")


def error_bars(results: dict, out_dir: Path, title: str,
               name: str = "fidelity_errors.png") -> Path:
    """Signed relative error per metric and policy (or workload), with the 5% and 15% bands."""
    metrics = list(next(iter(results.values()))["error"])
    fig = Figure(figsize=(12, 5), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(results)
    x = np.arange(len(metrics))
    for i, (policy, result) in enumerate(results.items()):
        errors = [100 * (result["error"][m] or 0.0) for m in metrics]
        ax.bar(x + (i - (len(results) - 1) / 2) * width, errors, width, label=policy)
    ax.axhspan(-5, 5, color="green", alpha=0.1, label="within 5%")
    for bound in (-15, 15):
        ax.axhline(bound, color="red", linestyle=":", linewidth=1)
    ax.set_xticks(x, [m.removesuffix("_ms") for m in metrics], rotation=20)
    ax.set_ylabel("simulated vs measured (%, signed)")
    every = [abs(r["error"][m]) for r in results.values() for m in metrics
             if r["error"][m] is not None]
    median = 100 * float(np.median(every)) if every else float("nan")
    ax.set_title(f"Simulator error per metric: median |error| {median:.1f}%\n{title}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    path = out_dir / name
    fig.savefig(path, dpi=110)
    return path


def write_fidelity_charts(results: dict, runs: dict[str, tuple[RunResult, RunResult]],
                          out_dir: Path, title: str) -> list[Path]:
    """Both fidelity charts; returns their paths."""
    return [cdf_overlay(runs, out_dir, title), error_bars(results, out_dir, title)]


def write_validation(out_dir: Path, title: str, results: dict,
                     runs: dict[str, tuple[RunResult, RunResult]]) -> list[Path]:
    """validate --out: the error table as CSV and the fidelity charts; the charts' paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"policy": p, "metric": k, "measured": r["measured"].get(k),
             "simulated": r["simulated"].get(k), "error": r["error"][k]}
            for p, r in results.items() for k in VALIDATED]
    pd.DataFrame(rows).to_csv(out_dir / "fidelity_errors.csv", index=False)
    return write_fidelity_charts(results, runs, out_dir, title)
