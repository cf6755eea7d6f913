"""Report section: conversations. Multi-turn chat against single-turn prompts of the same
lengths on one GPU (prefix-cache hit rate, TTFT), and the routers across replicas on it.

Each turn's prompt is the conversation so far plus a new question; a turn is sent its think
time after the previous answer (closed loop, as `simulate` and `bench-serve` send sessions).
The single-turn traffic is the same rows without their shared-prefix columns: the same
lengths on the same schedule, each prompt its own text.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from servelab.reporting.sections import Section, default_deployment  # noqa: E402
from sim.cluster.config import ClusterConfig  # noqa: E402
from sim.cluster.router import RouterConfig  # noqa: E402
from sim.engine.scheduler_config import SchedulerConfig  # noqa: E402
from sim.policy_runs import simulate_policy  # noqa: E402
from workloads import Trace, open_trace  # noqa: E402

CHAT = ("synthetic:users={users},rate={rate:g},turns=uniform(3,8),think=lognormal(10,0.5),"
        "question=lognormal(400,0.5),output=lognormal(150,0.5)")
HARDWARE, POLICY = "a100-80gb", "continuous"
DEPLOYMENT = "Llama-3-8B bf16 on A100-80GB (simulated, fitted GPU model)"
ROUTERS = ("round-robin", "least-requests", "prefix-aware")
KEPT = ("prefix_cache_hit_rate", "median_ttft_ms", "p99_ttft_ms", "request_throughput")


def single_turn(trace: Trace) -> Trace:
    """The same rows with every prompt its own text (the shared-prefix columns dropped)."""
    shared = [c for c in ("prefix_hash_ids", "prefix_hash_tokens") if c in trace.table]
    return Trace(f"{trace.name} (single-turn)", trace.table.drop(columns=shared))


def sessions_section(out: Path, users: int = 200, rate: float = 2.0, replicas: int = 4
                     ) -> Section:
    """Chat against single-turn on one GPU, then `replicas` x the users behind each router."""
    backend, blocks = default_deployment(HARDWARE)
    config = SchedulerConfig(POLICY, blocks)

    def run(trace: Trace, cluster: ClusterConfig | None = None) -> dict:
        summary = simulate_policy(trace, config, backend, None, False, cluster=cluster).summary
        return {key: summary[key] for key in KEPT}

    chat = open_trace(CHAT.format(users=users, rate=rate))
    one = {"chat": run(chat), "single-turn": run(single_turn(chat))}
    many_chat = open_trace(CHAT.format(users=users * replicas, rate=rate * replicas))
    routed = {router: {"chat": run(many_chat, cluster),
                       "single-turn": run(single_turn(many_chat), cluster)}
              for router in ROUTERS
              for cluster in [ClusterConfig(replicas, RouterConfig(router))]}
    best = max(ROUTERS, key=lambda r: routed[r]["chat"]["prefix_cache_hit_rate"])
    finding = (f"Multi-turn chat finds {one['chat']['prefix_cache_hit_rate']:.0%} of its prompt "
               f"tokens cached, where single-turn prompts of the same lengths find none; across "
               f"{replicas} replicas the {best} router keeps "
               f"{routed[best]['chat']['prefix_cache_hit_rate']:.0%} against round-robin's "
               f"{routed['round-robin']['chat']['prefix_cache_hit_rate']:.0%}")
    path = _chart(one, routed, replicas, finding, out / "sessions.png")
    setup = {"chat": CHAT.format(users=users, rate=rate), "requests": len(chat),
             "replicas": replicas, "requests_replicated": len(many_chat), "policy": POLICY,
             "kv_blocks": blocks}
    return Section("Conversations: sessions, prefix caching and routing", finding, [path],
                   _body(one, routed, setup), {"setup": setup, "one_gpu": one,
                                               "routers": routed})


def _body(one: dict, routed: dict, setup: dict) -> str:
    lines = [f"`{setup['chat']}`: {setup['requests']:,} turns of 200 conversations on "
             f"{DEPLOYMENT}, {setup['kv_blocks']:,} KV blocks, {setup['policy']} batching, "
             f"closed loop; then 4x the users on {setup['replicas']} replicas "
             f"({setup['requests_replicated']:,} turns). Method and the live-server check: "
             "docs/workloads.md.", "",
             "| traffic | where | hit rate | median TTFT | p99 TTFT | req/s |",
             "|---|---|---:|---:|---:|---:|"]
    rows = [("one GPU", kind, one[kind]) for kind in one]
    rows += [(router, kind, routed[router][kind]) for router in routed for kind in ("chat",
                                                                                   "single-turn")]
    lines += [f"| {kind} | {where} | {s['prefix_cache_hit_rate']:.1%} | "
              f"{s['median_ttft_ms']:,.0f} ms | {s['p99_ttft_ms']:,.0f} ms | "
              f"{s['request_throughput']:.2f} |" for where, kind, s in rows]
    return "\n".join(lines)


def _chart(one: dict, routed: dict, replicas: int, finding: str, path: Path) -> Path:
    """Left: hit rate and p99 TTFT, chat against single-turn on one GPU; right: the same
    per router across the replicas."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [1, 2]})
    groups = [("one GPU", one)] + [(r, routed[r]) for r in routed]
    for ax, chosen in ((axes[0], groups[:1]), (axes[1], groups[1:])):
        x = range(len(chosen))
        for offset, kind, colour in ((-0.2, "chat", "tab:blue"), (0.2, "single-turn",
                                                                   "tab:grey")):
            hits = [g[kind]["prefix_cache_hit_rate"] * 100 for _, g in chosen]
            bars = ax.bar([i + offset for i in x], hits, 0.4, color=colour, label=kind)
            for bar, (_, g) in zip(bars, chosen, strict=True):
                ax.annotate(f"p99 {g[kind]['p99_ttft_ms'] / 1e3:.2f} s",
                            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(x), [name for name, _ in chosen])
        ax.set_ylim(0, 100)
        ax.set_ylabel("prefix-cache hit rate (%)")
    axes[0].legend(fontsize=8)
    axes[1].set_title(f"{replicas} replicas, 4x the users", fontsize=9)
    fig.suptitle(finding, fontsize=9, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
