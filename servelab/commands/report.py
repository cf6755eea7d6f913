"""`servelab report`: regenerate the committed report (charts and a markdown page) from
scratch: batching measured and simulated, the ITL spike of a long prefill, an undersized
KV pool, latency vs load with capacity at SLO, simulator fidelity (against the executor, the
fitted GPU model against GPU measurements, and against vLLM from the committed run of
benchmarks/peers/server_fidelity.py), prefix caching, conversations (multi-turn chat against
single-turn, and routers across replicas), clusters (replicas per router, and
prefill/decode disaggregation), and queue orders with preemption by swap.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from servelab.reporting import sections
from servelab.reporting.capacity import latency_vs_load
from servelab.reporting.clusters import clusters
from servelab.reporting.gpu_fidelity import gpu_fidelity_section
from servelab.reporting.prefix_caching import prefix_caching
from servelab.reporting.queues import queue_orders
from servelab.reporting.report import machine, write_markdown
from servelab.reporting.server_fidelity import server_fidelity
from servelab.reporting.sessions import sessions_section
from servelab.sim_args import write_json_atomic
from sim.engine.scheduler_config import POLICIES


def register(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser("report", help="regenerate the report: charts + markdown",
                                   description=__doc__.splitlines()[0])
    report.add_argument("--out", type=Path, default=Path("reports"),
                        help="directory for report.md, report.json and figures/ "
                             "(default reports)")
    report.add_argument("--workers", type=int, default=None,
                        help="processes for the simulated sections (default: one per core)")
    report.add_argument("--skip-measured", action="store_true",
                        help="leave out the sections that run the model (1 and 5)")
    report.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    figures = args.out / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    def log(what: str) -> None:
        print(f"[{time.perf_counter() - started:4.0f} s] {what}", file=sys.stderr, flush=True)

    workload = sections.MeasuredWorkload()
    done: list[sections.Section] = []
    if not args.skip_measured:
        log("each policy measured on the executor and simulated")
        results, runs = sections.measured_vs_simulated(workload, POLICIES)
        done.append(sections.static_vs_continuous(results, workload, figures))
    log("the ITL spike of a long prefill")
    done.append(sections.itl_spike(figures))
    log("an undersized KV pool")
    done.append(sections.starvation(figures))
    log("latency vs load and capacity at SLO")
    done.append(latency_vs_load(figures, args.workers))
    if not args.skip_measured:
        done.append(sections.fidelity(results, runs, workload, figures))
    log("the fitted GPU model against GPU measurements")
    done.append(gpu_fidelity_section(figures))
    vllm = args.out / "fidelity" / "vllm-server"
    if (vllm / "calibration.json").exists():  # benchmarks/peers/server_fidelity.py's committed run
        done.append(server_fidelity(vllm, figures))
    log("prefix caching against KV pool size")
    done.append(prefix_caching(figures, args.workers))
    log("conversations: sessions, prefix caching and routing")
    done.append(sessions_section(figures))
    log("clusters: replicas per router, and P/D against co-located replicas")
    done.append(clusters(figures, args.workers))
    log("queue orders and preemption by swap")
    done.append(queue_orders(figures, args.workers))
    elapsed = time.perf_counter() - started
    write_markdown(args.out / "report.md", done, elapsed)
    write_json_atomic(args.out / "report.json", {
        "seconds": elapsed, "machine": machine(),
        "sections": {s.title: {"finding": s.finding, **s.data} for s in done}})
    print(f"wrote {args.out / 'report.md'} and {len(list(figures.glob('*.png')))} charts "
          f"in {elapsed:.0f} s")
    return 0
