"""What the queue-orders section shows, read from its numbers only: TTFT per tenant and per
priority class, SJF against FCFS, swap against recompute; as charts, tables and paragraphs."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import NamedTuple

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from servelab.reporting.charts.basic import DPI

NO_CACHE, WITH_CACHE, SWAP = "recompute, no prefix cache", "recompute, prefix cache", "swap"
# (summary key, panel title, unit, log y) of the SJF panels; values in seconds.
_SJF_PANELS = (("median_ttft_ms", "TTFT p50", "seconds (log)", True),
               ("p99_ttft_ms", "TTFT p99", "seconds", False),
               ("mean_e2el_ms", "E2EL mean", "seconds", False))
_STATS = (("median_ttft_ms", "p50"), ("p99_ttft_ms", "p99"))


def priority_label(aging_s: float) -> str:
    return f"priority, aging {aging_s:g} s"


def sjf_label(noise: float) -> str:
    return f"sjf, noise {noise:g}"


def fmt_s(ms: float) -> str:
    """Milliseconds as seconds: two significant digits below 10 s."""
    return f"{ms / 1e3:.2g} s" if ms < 1e4 else f"{ms / 1e3:.1f} s"


def _title(fig: Figure, finding: str, subtitle: str) -> None:
    fig.suptitle(f"{textwrap.fill(finding, 150)}\n{subtitle}", fontsize=10)


def _bars(ax: Axes, values: dict[str, list[float]], ticks: list[str], log: bool) -> None:
    """values[label] = one bar per tick, labels side by side, the legend above the bars."""
    x = np.arange(len(ticks))
    width = 0.8 / len(values)
    for i, (label, heights) in enumerate(values.items()):
        bars = ax.bar(x + (i - (len(values) - 1) / 2) * width, heights, width,
                      color=f"C{i}", edgecolor="black", linewidth=0.5, label=label)
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in heights], fontsize=7)
    heights = [h for hs in values.values() for h in hs]
    if log:  # the top decade or so left free for the legend
        ax.set_yscale("log")
        ax.set_ylim(min(heights) / 2, max(heights) * 30)
    else:
        ax.set_ylim(0, max(heights) * 1.35)
    ax.set_xticks(x, ticks)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def tenants_and_priorities(tenants: dict[str, dict], priorities: dict[str, dict],
                           finding: str, subtitle: str, path: Path) -> Path:
    """tenants[queue] and priorities[run] = kept summaries: each tenant's and each class's
    median and p99 TTFT, with Jain's index and the longest overtaken wait in the legends."""
    fig = Figure(figsize=(15, 5.2), layout="constrained")
    panels = (
        (tenants, "tenants", {"light": "light", "flood": "flood"},
         lambda s: f"Jain's index {s['jain_fairness_index']:.3f}",
         "two tenants, the flood at 10x the light one's rate"),
        (priorities, "priorities", {"0": "high", "1": "low"},
         lambda s: f"overtaken <= {s['longest_overtaken_s']:.1f} s",
         "two classes: 20% high priority (0), 80% low (1)"))
    for ax, (runs, kind, classes, note, title) in zip(fig.subplots(1, 2), panels, strict=True):
        groups = [(cls, key) for cls in classes for key, _ in _STATS]
        _bars(ax, {f"{run} ({note(s)})": [s[kind][c][k] / 1e3 for c, k in groups]
                   for run, s in runs.items()},
              [f"{classes[c]}\nTTFT {n}" for c in classes for _, n in _STATS], log=True)
        ax.set_ylabel("seconds (log)")
        ax.set_title(title)
    _title(fig, finding, subtitle)
    fig.savefig(path, dpi=DPI)
    return path


def sjf(runs: dict[str, dict[str, dict]], aging_s: float, finding: str, subtitle: str,
        path: Path) -> Path:
    """runs[policy][queue] = kept summary: median and p99 TTFT and mean E2EL per queue
    order, one bar per batching policy, the aging bound dashed on the p99 panel."""
    fig = Figure(figsize=(16, 4.8), layout="constrained")
    queues = list(next(iter(runs.values())))
    for ax, (key, title, unit, log) in zip(fig.subplots(1, 3), _SJF_PANELS, strict=True):
        _bars(ax, {p: [by[q][key] / 1e3 for q in queues] for p, by in runs.items()},
              [q.replace(", ", "\n") for q in queues], log)
        if key == "p99_ttft_ms" and ax.get_ylim()[1] > aging_s:  # else nothing came near it
            ax.axhline(aging_s, color="black", linestyle="--", linewidth=1)
            ax.annotate(f"aging bound, {aging_s:g} s", (0.01, aging_s), ha="left",
                        va="bottom", xycoords=("axes fraction", "data"), fontsize=8)
        ax.set_ylabel(unit)
        ax.set_title(title)
    _title(fig, finding, subtitle)
    fig.savefig(path, dpi=DPI)
    return path


def swap(runs: dict[str, dict[str, dict[str, dict]]], finding: str, subtitle: str,
         path: Path) -> Path:
    """runs[hardware][str(prompt)][mode] = kept summary: mean E2EL against the prompt length,
    one panel per GPU, and every run's preemptions on a last panel (dotted: second GPU)."""
    fig = Figure(figsize=(6 * len(runs) + 5, 5), layout="constrained")
    *e2el_axes, ax_pre = fig.subplots(1, len(runs) + 1)
    for h, (ax, (hardware, by_prompt)) in enumerate(zip(e2el_axes, runs.items(), strict=True)):
        prompts = [int(p) for p in by_prompt]
        for i, mode in enumerate(by_prompt[str(prompts[0])]):
            ax.plot(prompts, [by_prompt[str(p)][mode]["mean_e2el_ms"] / 1e3 for p in prompts],
                    "o-", color=f"C{i}", label=mode)
            ax_pre.plot(prompts, [by_prompt[str(p)][mode]["preemptions"] for p in prompts],
                        "o", linestyle=("-", ":", "--")[h % 3], color=f"C{i}",
                        label=f"{mode}, {hardware}")
        ax.set_ylim(bottom=0)
        ax.set_ylabel("E2EL mean (s)")
        ax.set_title(f"{hardware}: mean end-to-end latency")
    ax_pre.set_yscale("log")
    ax_pre.set_ylabel("preemptions (log)")
    ax_pre.set_title("preemptions in the run")
    for ax in (*e2el_axes, ax_pre):
        ax.set_xscale("log", base=2)
        ax.set_xticks(prompts, [f"{p:,}" for p in prompts])
        ax.minorticks_off()
        ax.set_xlabel("prompt length (tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7 if ax is ax_pre else 8)
    _title(fig, finding, subtitle)
    fig.savefig(path, dpi=DPI)
    return path


# ---- tables and paragraphs ------------------------------------------------------------------

def _sec(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1e3:.2f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table, every column but the first two right-aligned."""
    lines = ["| " + " | ".join(header) + " |",
             "|---|---|" + "---:|" * (len(header) - 2)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def class_table(runs: dict[str, dict], kind: str, names: dict[str, str]) -> str:
    """One row per run x class (kind: tenants or priorities)."""
    header = ["queue", kind[:-3] + "y" if kind == "priorities" else "tenant", "requests",
              "median TTFT (s)", "p99 TTFT (s)", "service received / asked",
              "Jain's index" if kind == "tenants" else "longest overtaken (s)", "preemptions"]
    rows = [[run, names.get(c, c), f"{r['requests']:,}", _sec(r["median_ttft_ms"]),
             _sec(r["p99_ttft_ms"]), f"{r['served_tokens'] / r['demand_tokens']:.0%}",
             f"{s['jain_fairness_index']:.3f}" if kind == "tenants"
             else f"{s['longest_overtaken_s']:.1f}", f"{s['preemptions']:,}"]
            for run, s in runs.items() for c, r in s[kind].items()]
    return _table(header, rows)


def sjf_table(runs: dict[str, dict[str, dict]]) -> str:
    """One row per batching policy x queue order."""
    return _table(["batching", "queue", "median TTFT (s)", "p99 TTFT (s)", "mean E2EL (s)",
                   "served (req/s)"],
                  [[p, q, _sec(s["median_ttft_ms"]), _sec(s["p99_ttft_ms"]),
                    _sec(s["mean_e2el_ms"]), f"{s['request_throughput']:.1f}"]
                   for p, by in runs.items() for q, s in by.items()])


def swap_table(runs: dict[str, dict[str, dict[str, dict]]], pools: dict[str, int]) -> str:
    """One row per GPU x prompt length: each mode's mean E2EL and preemptions."""
    modes = (NO_CACHE, WITH_CACHE, SWAP)
    header = ["GPU", "prompt (tokens)", "KV pool (blocks)",
              *(f"{m}: mean E2EL (s), preemptions" for m in modes),
              "tokens recomputed, cache off / on"]
    # A chunk that leaves one prompt token computes it as a decode row: clip the -1s.
    rows = [[hw, f"{int(p):,}", f"{pools[p]:,}",
             *(f"{_sec(r[m]['mean_e2el_ms'])}, {r[m]['preemptions']:,}" for m in modes),
             " / ".join(f"{max(r[m]['recomputed_tokens'], 0):,}" for m in modes[:2])]
            for hw, by_prompt in runs.items() for p, r in by_prompt.items()]
    return _table(header, rows)


class SwapGap(NamedTuple):
    """Recompute's mean E2EL over swap's: the largest with the prefix cache off, where it is,
    and the largest with the cache on."""

    cache_off: float
    hardware: str
    prompt: str
    cache_on: float

    def where(self) -> str:
        return f"{int(self.prompt):,}-token prompts, {self.hardware}"


def swap_gap(runs: dict[str, dict[str, dict[str, dict]]]) -> SwapGap:
    """runs[hardware][str(prompt)][mode] = kept summary -> the largest gaps."""
    ratios = {(hw, p): [r[m]["mean_e2el_ms"] / r[SWAP]["mean_e2el_ms"]
                        for m in (NO_CACHE, WITH_CACHE)]
              for hw, by_prompt in runs.items() for p, r in by_prompt.items()}
    hardware, prompt = max(ratios, key=lambda k: ratios[k][0])
    return SwapGap(ratios[hardware, prompt][0], hardware, prompt,
                   max(r[1] for r in ratios.values()))


def tenant_text(data: dict) -> str:
    runs, plan = data["tenants"], data["setup"]["plan"]
    fcfs, fair = (runs[q]["tenants"] for q in ("fcfs", "fair"))
    asked = fcfs["light"]["served_tokens"] / fcfs["light"]["demand_tokens"]
    return (
        f"**Two tenants.** A flood of {plan['flood_requests']:,} requests at 20 req/s (prompts "
        "lognormal around 512 tokens) and a light tenant sending a tenth as many 256-token "
        "prompts at 2 req/s, 64-token outputs; the engine serves "
        f"{runs['fcfs']['request_throughput']:.1f} req/s. Under fcfs the light tenant queues "
        f"behind the flood: p99 TTFT {fmt_s(fcfs['light']['p99_ttft_ms'])}, the flood's "
        f"{fmt_s(fcfs['flood']['p99_ttft_ms'])}. fair admits first from the tenant that has "
        "received the least service, so the light tenant's p99 falls to "
        f"{fmt_s(fair['light']['p99_ttft_ms'])} and the flood's is "
        f"{fmt_s(fair['flood']['p99_ttft_ms'])}. Jain's index moves only from "
        f"{runs['fcfs']['jain_fairness_index']:.3f} to {runs['fair']['jain_fairness_index']:.3f}"
        ": it counts the service each tenant received while requests arrive, and under fcfs "
        f"the light tenant still received {asked:.0%} of what it asked, only late.")


def priority_text(data: dict) -> str:
    runs, setup = data["priorities"], data["setup"]
    long_label, short_label = (priority_label(a) for a in setup["agings_s"])
    high = {run: s["priorities"]["0"] for run, s in runs.items()}
    low = {run: s["priorities"]["1"] for run, s in runs.items()}
    overtaken = [runs[label]["longest_overtaken_s"] for label in (long_label, short_label)]
    text = (
        f"**Priorities.** {setup['plan']['priority_requests']:,} requests at 20 req/s, shaped "
        "like the flood's, a fifth at priority 0 (high) and the rest at 1 (low). priority admits "
        "high requests first and evicts running low ones to make room "
        f"({runs[long_label]['preemptions']:,} preemptions). The high class's p99 TTFT falls "
        f"from {fmt_s(high['fcfs']['p99_ttft_ms'])} under fcfs to "
        f"{fmt_s(high[long_label]['p99_ttft_ms'])}; the low class's is "
        f"{fmt_s(low[long_label]['p99_ttft_ms'])} against {fmt_s(low['fcfs']['p99_ttft_ms'])}. The "
        "longest any request was overtaken (from its arrival to the last first admission of a "
        f"later arrival ahead of it) is {overtaken[0]:.1f} s with {long_label[10:]} and "
        f"{overtaken[1]:.1f} s with {short_label[10:]}.")
    if overtaken[1] >= 0.95 * setup["agings_s"][1]:
        text += (
            f" With the shorter bound the low backlog outgrows it: the overdue low requests are "
            "admitted in arrival order ahead of new high ones, and the high class's p99 climbs "
            f"to {fmt_s(high[short_label]['p99_ttft_ms'])} (median "
            f"{fmt_s(high[short_label]['median_ttft_ms'])}). Under sustained overload a short "
            "aging bound turns priority back into fcfs.")
    return text


def sjf_text(data: dict) -> str:
    runs, setup = data["sjf"], data["setup"]
    oracle, noisy = sjf_label(0), sjf_label(setup["sjf_noises"][-1])
    chunked, base = runs["chunked"], runs["continuous"]["fcfs"]["mean_e2el_ms"]
    gain = {(p, q): 1 - s["mean_e2el_ms"] / base for p, by in runs.items() for q, s in by.items()}

    def kept(key: str) -> str:  # share of the oracle's gain over chunked fcfs kept by noise
        gained = chunked["fcfs"][key] - chunked[oracle][key]
        return f"{(chunked['fcfs'][key] - chunked[noisy][key]) / gained:.0%}" if gained > 0 else "-"

    return (
        f"**SJF against FCFS.** azure-conv's first {setup['plan']['sjf_requests']:,} requests "
        f"at {setup['sjf_qps_scale']:g}x its rate ({setup['sjf_rate_rps']:.1f} req/s; chunked "
        f"fcfs serves {chunked['fcfs']['request_throughput']:.1f}). SJF admits the shortest "
        "predicted output first, so most requests skip the queue: chunked's median TTFT "
        f"{_direction(chunked[oracle]['median_ttft_ms'], chunked['fcfs']['median_ttft_ms'])} "
        f"from {fmt_s(chunked['fcfs']['median_ttft_ms'])} to "
        f"{fmt_s(chunked[oracle]['median_ttft_ms'])}. The long outputs wait until aging makes "
        "them overdue: p99 TTFT goes from "
        f"{fmt_s(chunked['fcfs']['p99_ttft_ms'])} to {fmt_s(chunked[oracle]['p99_ttft_ms'])}. "
        f"Against continuous fcfs, chunked prefill alone cuts mean E2EL "
        f"{gain['chunked', 'fcfs']:.0%}, SJF alone {gain['continuous', oracle]:.0%}, both "
        f"{gain['chunked', oracle]:.0%}: measure SJF against chunked. A predictor off by a "
        f"factor exp({setup['sjf_noises'][-1]:g} z) keeps {kept('mean_e2el_ms')} of the "
        f"oracle's mean-E2EL gain over chunked fcfs and {kept('median_ttft_ms')} of its "
        "median-TTFT gain.")


def _direction(after: float, before: float) -> str:
    return "falls" if after < before else "rises"


def swap_text(data: dict) -> str:
    runs, setup = data["swap"], data["setup"]
    gap, (hardware, first) = swap_gap(runs), next(iter(runs.items()))
    kib = next(iter(setup["costs"].values()))["kv_kib_per_token"]
    cost = "; ".join(f"{c['recompute_us']:.0f} us against {c['swap_us']:.1f} us (out and "
                     f"back) on {hw} at {c['pcie_gb_s']:g} GB/s each way"
                     for hw, c in setup["costs"].items())
    ratio = {p: r[NO_CACHE]["mean_e2el_ms"] / r[SWAP]["mean_e2el_ms"] for p, r in first.items()}
    short, long = min(first, key=int), max(first, key=int)
    swapped, evicted = (sum(r[SWAP][k] for by in runs.values() for r in by.values())
                        for k in ("swapped_out", "preemptions"))
    thrash = [p for p, r in first.items()
              if r[NO_CACHE]["preemptions"] > 2 * r[SWAP]["preemptions"]]
    text = (
        f"**Swap against recompute.** {setup['plan']['swap_requests']} requests per prompt "
        f"length, {setup['swap_output']}-token outputs, arriving at "
        f"{setup['swap_prompt_tokens_per_s']:,} prompt tokens/s into a KV pool that holds "
        f"{setup['swap_pool_requests']} whole requests, so decodes keep evicting the newest "
        f"request; swap has a {setup['swap_space_gib']:g} GiB host pool, and "
        f"{evicted - swapped:,} of its {evicted:,} evictions fell back to recompute. Per "
        "token, recomputing costs about 2 x parameters FLOPs plus attention and swapping 2 x "
        f"its {kib:g} KiB of KV over PCIe: {cost}. "
        f"With the prefix cache off, recompute's mean E2EL is {ratio[short] - 1:.0%} above "
        f"swap's at {int(short):,}-token prompts and {ratio[long]:.1f}x swap's at "
        f"{int(long):,} ({hardware}).")
    if thrash:
        text += (
            f" From {int(thrash[0]):,} tokens recompute thrashes: chunked prefill re-admits a "
            "victim as soon as one chunk fits, it is then the newest running request, and the "
            "next decode that needs a block evicts it again before its prefill ends; a swap-in "
            f"waits until the victim's whole KV fits. Hence the {gap.cache_off:.1f}x at "
            f"{gap.where()}.")
    return text + (
        " With the prefix cache on (the default) a victim's recompute finds its own blocks "
        "still cached, since they are evicted last, and is admitted only once they fit, like a "
        f"swap-in: recompute is then at most {gap.cache_on - 1:.0%} slower than swap.")
