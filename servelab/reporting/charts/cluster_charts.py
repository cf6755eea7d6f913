"""Charts and tables of the clusters section: p99 TTFT against replica count per router (one
panel per trace), and P/D against co-located replicas on equal GPUs as the rate grows."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from servelab.reporting.charts.basic import DPI

# Marker and line style per router, so routers whose runs coincide stay visible.
_STYLES = (("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"))

# (summary key, panel title, unit, scale, log y) of the P/D panels.
_PD_PANELS = (
    ("p99_ttft_ms", "TTFT p99", "seconds (log)", 1e-3, True),
    ("p99_itl_ms", "ITL p99", "ms", 1.0, False),
)


def replicas_by_router(by_router: dict[str, dict[str, dict[str, dict]]],
                       names: dict[str, str], target_ms: float, finding: str, subtitle: str,
                       path: Path) -> Path:
    """by_router[trace][router][str(replicas)] = summary: p99 TTFT against replicas, one
    line per router, one panel per trace, the TTFT target dashed."""
    fig = Figure(figsize=(14, 5), layout="constrained")
    axes = fig.subplots(1, len(by_router), squeeze=False)[0]
    for ax, (trace, routers) in zip(axes, by_router.items(), strict=True):
        for i, (router, runs) in enumerate(routers.items()):
            replicas = [int(n) for n in runs]
            marker, line = _STYLES[i % len(_STYLES)]
            ax.plot(replicas, [runs[str(n)]["p99_ttft_ms"] / 1e3 for n in replicas],
                    marker=marker, linestyle=line, color=f"C{i}", label=router, alpha=0.8,
                    markersize=8 - 1.5 * i, markerfacecolor="none" if i % 2 else None)
        ax.axhline(target_ms / 1e3, color="black", linestyle="--", linewidth=1,
                   label=f"{target_ms / 1e3:g} s")
        ax.set_xscale("log", base=2)
        ax.set_xticks(replicas, [str(n) for n in replicas])
        ax.set_yscale("log")
        ax.set_xlabel("replicas (one H100 each)")
        ax.set_ylabel("TTFT p99, seconds (log)")
        ax.set_title(names[trace], fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"{_wrap(finding)}\n{subtitle}", fontsize=10)
    fig.savefig(path, dpi=DPI)
    return path


def pd_vs_colocated(by_deployment: dict[str, dict[str, dict]], rates_rps: list[float],
                    target_ms: float, finding: str, subtitle: str, path: Path) -> Path:
    """by_deployment[label][str(qps scale)] = summary, the scales in the order of rates_rps:
    p99 TTFT (the target dashed) and p99 ITL against the request rate, one line each."""
    fig = Figure(figsize=(14, 5), layout="constrained")
    axes = fig.subplots(1, len(_PD_PANELS))
    for ax, (key, title, unit, scale, log) in zip(axes, _PD_PANELS, strict=True):
        for i, (label, runs) in enumerate(by_deployment.items()):
            ax.plot(rates_rps, [scale * s[key] for s in runs.values()], "o-", color=f"C{i}",
                    label=label)
        if log:
            ax.axhline(target_ms / 1e3, color="black", linestyle="--", linewidth=1,
                       label=f"{target_ms / 1e3:g} s")
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"{_wrap(finding)}\n{subtitle}", fontsize=10)
    fig.savefig(path, dpi=DPI)
    return path


def replicas_table(by_router: dict[str, dict[str, dict]], name: str) -> str:
    """Markdown: one row per router x replicas of one trace (one engine: a single row)."""
    rows = [f"{name}:", "", "| replicas | router | p99 TTFT (s) | median TTFT (s) | "
            "prefix-cache hit rate | rejected |", "|---:|---|---:|---:|---:|---:|"]
    routers = list(by_router)
    for n in by_router[routers[0]]:
        for router in routers if n != "1" else routers[:1]:
            s = by_router[router][n]
            rows.append(f"| {n} | {router if n != '1' else 'none (one engine)'} | "
                        f"{s['p99_ttft_ms'] / 1e3:.2f} | {s['median_ttft_ms'] / 1e3:.2f} | "
                        f"{s['prefix_cache_hit_rate']:.1%} | {s['rejected']} |")
    return "\n".join(rows)


def pd_table(by_deployment: dict[str, dict[str, dict]], rates_rps: list[float]) -> str:
    """Markdown: one row per rate x deployment, the scales in the order of rates_rps."""
    rows = ["| rate (req/s) | deployment | p99 TTFT (s) | median TTFT (s) | p99 ITL (ms) | "
            "median ITL (ms) |", "|---:|---|---:|---:|---:|---:|"]
    for i, rate in enumerate(rates_rps):
        for label, by in by_deployment.items():
            scale, s = list(by.items())[i]
            rows.append(f"| {rate:.1f} ({float(scale):g}x) | {label} | "
                        f"{s['p99_ttft_ms'] / 1e3:.2f} | {s['median_ttft_ms'] / 1e3:.2f} | "
                        f"{s['p99_itl_ms']:.0f} | {s['median_itl_ms']:.0f} |")
    return "\n".join(rows)


def _wrap(text: str, width: int = 150) -> str:
    """Break a long finding at the last '; ' or ', ' before width characters."""
    if len(text) <= width:
        return text
    for sep in ("; ", ", "):
        cut = text.rfind(sep, 0, width)
        if cut > 0:
            return text[:cut + 1] + "\n" + _wrap(text[cut + len(sep):], width)
    return text
