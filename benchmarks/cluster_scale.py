"""How fast the simulator replays a large trace over many replicas, on one core.

The target: a 1,000,000-request synthetic trace over 32 replicas behind a router within
60 s (the reference: one replica of the 8,819-request azure-code trace took 41 s in the
best existing simulator on the same machine class). The trace has azure-conv's lengths
(resampled whole rows) and Poisson arrivals at `--rate-per-replica` x replicas; the
deployment is Llama-3-8B on one H100 per replica, chunked prefill, priced by the fitted GPU
model (`--cost roofline`: the analytic roofline; `--cost kernels`: vLLM's measured kernels; to
compare their cost). Prints the wall time of the replay alone and its cost per request, per
engine step and per token. `--listed` lists every decode row in every plan instead of
fast-forwarding them (sim.engine.fast_forward), and so prices no run of decode-only steps in bulk
either (sim.engine.fast_forward_run): the same results, the cost both save. `--pd P:D` replays P
prefill and D decode engines instead of the replicas (the rate follows P + D).

    python benchmarks/cluster_scale.py [--requests 1000000] [--replicas 32] [--listed]
        [--pd P:D]
"""

from __future__ import annotations

import argparse
import time

from executor.loading import cpu_model
from sim.cluster.config import ClusterConfig
from sim.cluster.router import RouterConfig
from sim.cluster.run import run_cluster
from sim.cost.gpu_cost import gpu_cost_backend
from sim.cost.kernel_cost import kernel_cost_backend
from sim.cost.kernel_tables import KernelTables
from sim.cost.roofline import AnalyticCostModel
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.metrics import summarize
from sim.replay.workload import requests_from_trace
from sim.specs.engine_limits import ENGINE_DEFAULTS
from workloads import open_trace

REFERENCE_S = 41.0  # one replica of azure-code in the best existing simulator



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--replicas", type=int, default=32)
    parser.add_argument("--rate-per-replica", type=float, default=12.0)
    parser.add_argument("--router", default="least-requests")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--listed", action="store_true", help="list every decode row")
    parser.add_argument("--cost", default="gpu", choices=("gpu", "kernels", "roofline"),
                        help="cost model pricing the steps (compare their speed; kernels: "
                             "vLLM's measured kernels, sim.cost.kernel_cost)")
    parser.add_argument("--pd", metavar="P:D", help="prefill and decode engines instead")
    args = parser.parse_args()
    prefill, decode = map(int, args.pd.split(":")) if args.pd else (0, 0)
    roofline = AnalyticCostModel.preset("llama-3-8b", "h100")
    cluster = ClusterConfig(
        num_replicas=args.replicas, router=RouterConfig(args.router), num_prefill=prefill,
        num_decode=decode, kv_bytes_per_token=roofline.model.kv_bytes_per_token(
            roofline.dtype_bytes))
    rate = args.rate_per_replica * cluster.num_engines
    spec = (f"synthetic:n={args.requests},rate={rate:g},prompt=empirical(azure-conv),"
            "output=empirical(azure-conv)")
    start = time.perf_counter()
    requests = requests_from_trace(open_trace(spec, seed=args.seed))
    built_s = time.perf_counter() - start
    backend = (roofline if args.cost == "roofline"
               else kernel_cost_backend(roofline.model, roofline.hardware,
                                        KernelTables.load("h100")) if args.cost == "kernels"
               else gpu_cost_backend(roofline.model, roofline.hardware))
    config = SchedulerConfig(policy="chunked",
                             num_blocks=roofline.kv_pool_blocks(ENGINE_DEFAULTS.block_size))
    replicas = [Engine(Scheduler(config), backend, allow_fast_forward=not args.listed)
                for _ in range(cluster.num_engines)]
    start = time.perf_counter()
    result = run_cluster(requests, replicas, cluster)
    replay_s = time.perf_counter() - start
    summary = summarize(result.run_result())
    steps = summary["num_steps"]
    tokens = summary["total_output"]
    layout = f"P/D {args.pd}" if args.pd else f"{args.replicas} replicas"
    rows = "listed" if args.listed else "fast-forwarded"
    print(f"{cpu_model()}; {args.requests} requests, {layout}, router "
          f"{args.router}, {rate:g} req/s, decode rows {rows}")
    print(f"trace built in {built_s:.1f} s; replay {replay_s:.1f} s wall "
          f"(target 60 s; reference {REFERENCE_S:.0f} s for 8,819 requests on one replica)")
    print(f"  {replay_s / args.requests * 1e6:.1f} us per request, {replay_s / steps * 1e6:.1f} us "
          f"per step ({steps} steps, mean batch {summary['mean_batch_size']:.1f}), "
          f"{replay_s / tokens * 1e9:.0f} ns per output token ({tokens} tokens)")
    print(f"  completed {summary['completed']}, rejected {summary['rejected']}, "
          f"p99 TTFT {summary['p99_ttft_ms']:.0f} ms, p99 ITL {summary['p99_itl_ms']:.1f} ms")


if __name__ == "__main__":
    main()
