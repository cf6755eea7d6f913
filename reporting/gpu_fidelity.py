"""Charts of the GPU cost model's validation: predicted against measured Splitwise step
time (log-log, one colour per GPU and TP), and per-run errors beside LLMServingSim's."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def step_chart(errors: list, path: Path) -> None:
    """Predicted vs measured step time, log-log, colour per (GPU, TP), marker per phase."""
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    groups = sorted({(e.gpu, e.tp) for e in errors})
    colours = plt.get_cmap("tab10")
    for i, (gpu, tp) in enumerate(groups):
        for phase, marker in (("prefill", "o"), ("decode", "^")):
            pts = [e for e in errors if (e.gpu, e.tp, e.phase) == (gpu, tp, phase)]
            ax.scatter([e.measured_s * 1e3 for e in pts], [e.predicted_s * 1e3 for e in pts],
                       color=colours(i), marker=marker, s=22,
                       label=f"{gpu} TP{tp} {phase}")
    lo = min(min(e.measured_s, e.predicted_s) for e in errors) * 1e3 * 0.8
    hi = max(max(e.measured_s, e.predicted_s) for e in errors) * 1e3 * 1.2
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="measured step (ms)", ylabel="predicted step (ms)",
           title="Splitwise Llama-2-70B steps: fitted GPU model")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_chart(rows: list[dict], path: Path) -> None:
    """Signed error per run and metric, ours beside LLMServingSim's."""
    fig, ax = plt.subplots(figsize=(11, 5.5))
    labels = [f"{r['run'].replace('/', ' ')[:26]} {r['metric'][:-3]}" for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["our_error"] * 100 for r in rows], 0.4, label="servelab")
    ax.bar([i + 0.2 for i in x], [r["peer_error"] * 100 for r in rows], 0.4,
           label="LLMServingSim")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(list(x), labels, fontsize=6, rotation=90)
    ax.set_ylabel("error vs vLLM (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(errors: list, split_rows: list[dict], run_rows: list[dict],
                 out_dir: Path) -> list[Path]:
    """Both charts and the tables as JSON under out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "gpu_steps.png", out_dir / "gpu_runs.png", out_dir / "gpu_fidelity.json"]
    step_chart(errors, paths[0])
    run_chart(run_rows, paths[1])
    paths[2].write_text(json.dumps({"splitwise": split_rows, "runs": run_rows}, indent=1) + "\n")
    return paths
