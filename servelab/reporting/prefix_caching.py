"""Report section: prefix caching on the Mooncake trace. The hit rate each KV
pool size reaches against the trace's ceiling, and what caching does to TTFT and throughput."""

from __future__ import annotations

from pathlib import Path

from servelab.reporting.charts import report_charts
from servelab.reporting.sections import DEPLOYMENT, Section, default_deployment
from sim.engine.scheduler_config import SchedulerConfig
from sim.policy_runs import simulate_policies
from sim.specs.engine_limits import ENGINE_DEFAULTS
from workloads import Trace, load_bundled
from workloads.summary import prefix_reuse_ceiling

# KV pool sizes in blocks, besides the deployment's own. The smallest holds the trace's
# longest request (191,378 + 893 tokens = 12,017 blocks), so no pool rejects a request and
# every hit rate has the same denominator; the largest (64M tokens) holds every token of
# the trace at once, so nothing is ever evicted.
POOLS = (12_500, 100_000, 300_000, 1_000_000, 4_000_000)
MAX_MODEL_LEN = 200_000  # above the longest request
BLOCK_SIZE = ENGINE_DEFAULTS.block_size
POLICY = "chunked"
# Summary keys of the caching on/off comparison.
COMPARED = ("prefix_cache_hit_rate", "median_ttft_ms", "p99_ttft_ms", "output_throughput",
            "request_throughput", "rejected")


def _label(num_blocks: int, caching: bool) -> str:
    return f"{num_blocks:,} blocks, caching {'on' if caching else 'off'}"


def _configs(pools: list[int], compared: tuple[int, int]) -> dict[str, SchedulerConfig]:
    """Caching on at every pool size; caching off at the two pools of the comparison."""
    runs = [(blocks, True) for blocks in pools] + [(blocks, False) for blocks in compared]
    return {_label(blocks, on): SchedulerConfig(
        POLICY, blocks, BLOCK_SIZE, max_model_len=MAX_MODEL_LEN, enable_prefix_caching=on)
        for blocks, on in runs}


def prefix_caching(out: Path, workers: int | None = None, trace: Trace | None = None,
                   pools: tuple[int, ...] = POOLS) -> Section:
    """Hit rate against KV pool size, and caching on/off at the deployment's pool and at the
    largest, all at the trace's own arrival rate."""
    backend, default_pool = default_deployment()
    trace = trace if trace is not None else load_bundled("mooncake-synthetic")
    ceiling = prefix_reuse_ceiling(trace, BLOCK_SIZE)
    sizes = sorted({*pools, default_pool})
    compared = (default_pool, sizes[-1])
    outcomes = simulate_policies(trace, _configs(sizes, compared), backend, None, False, workers)
    summaries = {label: outcome.summary for label, outcome in outcomes.items()}
    hit_rate = [summaries[_label(b, True)]["prefix_cache_hit_rate"] for b in sizes]
    rejected = [summaries[_label(b, True)]["rejected"] for b in sizes]
    table = {_label(b, on): {k: summaries[_label(b, on)][k] for k in COMPARED}
             for b in compared for on in (True, False)}
    finding = _finding(hit_rate[sizes.index(default_pool)], hit_rate[-1], ceiling,
                       default_pool, table, compared[-1])
    subtitle = (f"{trace.name}, {len(trace):,} requests at the trace's rate "
                f"({(len(trace) - 1) / trace.span_s:.1f} req/s), {POLICY}; {DEPLOYMENT}")
    path = report_charts.prefix_caching(sizes, hit_rate, ceiling, default_pool, table, finding,
                                        subtitle, out / "prefix_caching.png")
    body = _body(trace, sizes, hit_rate, rejected, default_pool, ceiling, table)
    return Section("Prefix caching", finding, [path], body, {
        "ceiling": ceiling, "default_pool_blocks": default_pool,
        "hit_rate_by_pool": {str(b): h for b, h in zip(sizes, hit_rate, strict=True)},
        "rejected_by_pool": {str(b): r for b, r in zip(sizes, rejected, strict=True)},
        "caching_on_off": table})


def _finding(default_hit: float, largest_hit: float, ceiling: float, default_pool: int,
             table: dict[str, dict], largest: int) -> str:
    on, off = table[_label(largest, True)], table[_label(largest, False)]
    return (f"The default {default_pool:,}-block pool serves {default_hit:.0%} of prompt "
            f"tokens from the prefix cache, a {largest:,}-block pool {largest_hit:.0%} (the "
            f"trace's ceiling is {ceiling:.0%}) and cuts median TTFT "
            f"{off['median_ttft_ms'] / on['median_ttft_ms']:.1f}x")


def _body(trace: Trace, sizes: list[int], hit_rate: list[float], rejected: list[int],
          default_pool: int, ceiling: float, table: dict[str, dict]) -> str:
    rate = (len(trace) - 1) / trace.span_s
    intro = (
        "How much the cache serves depends on how long it keeps a prefix. Left: the share of "
        "prompt tokens found in the cache at admission against the KV pool size; it nears "
        "the ceiling (dashed: a cache that never evicts, `prefix_ceiling` in `servelab "
        "trace`) only once the pool holds most of the trace, and the dotted line is the pool "
        "one H100 has. Right: TTFT and throughput with caching on (solid) and off (hatched) "
        "at that pool and at the largest, which no single GPU holds.")
    served = table[_label(default_pool, False)]["request_throughput"]
    if served < 0.95 * rate:  # the engine falls behind: TTFT is mostly queueing
        intro += (f" Requests arrive at {rate:.1f}/s and without caching the deployment "
                  f"serves {served:.2f}/s, so the queue grows for the whole run and TTFT is "
                  "mostly waiting; every prompt token the cache serves shortens that queue.")
    intro += (f"\n\nSimulated: {trace.name}, {len(trace):,} requests at the trace's own "
              f"arrival times, {POLICY} prefill, max_model_len {MAX_MODEL_LEN:,}, "
              f"{BLOCK_SIZE}-token KV blocks; {DEPLOYMENT}.")
    pool_rows = ["| KV pool (blocks) | tokens | hit rate | rejected |", "|---:|---:|---:|---:|"]
    pool_rows += [f"| {b:,}{' (default)' if b == default_pool else ''} | {b * BLOCK_SIZE:,} | "
                  f"{h:.1%} | {r:,} |" for b, h, r in zip(sizes, hit_rate, rejected, strict=True)]
    pool_rows.append(f"| unbounded (ceiling) | | {ceiling:.1%} | |")
    run_rows = ["| run | hit rate | median TTFT (s) | p99 TTFT (s) | output tokens/s | "
                "requests/s |", "|---|---:|---:|---:|---:|---:|"]
    run_rows += [f"| {label} | {s['prefix_cache_hit_rate']:.1%} | "
                 f"{s['median_ttft_ms'] / 1e3:.1f} | {s['p99_ttft_ms'] / 1e3:.1f} | "
                 f"{s['output_throughput']:.0f} | {s['request_throughput']:.2f} |"
                 for label, s in table.items()]
    return "\n\n".join([intro, "\n".join(pool_rows), "\n".join(run_rows)])
