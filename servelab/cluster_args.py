"""Arguments that put several engines behind a router: replicas, P/D split, KV link."""

from __future__ import annotations

import argparse

from sim.cluster.config import DEFAULT_KV_LINK_GBPS, ClusterConfig
from sim.cluster.router import ROUTERS, RouterConfig
from sim.deployment import Deployment

# How vLLM's front end spreads requests over data-parallel engines: to the least loaded.
DATA_PARALLEL_ROUTER = "least-requests"


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    """--replicas, --router, --pd, --kv-link-gbps."""
    group = parser.add_argument_group("cluster")
    group.add_argument("--replicas", type=int, default=1,
                       help="engines behind the router, each with its own scheduler and KV "
                            "pool (default 1)")
    group.add_argument("--router", default=None, choices=ROUTERS,
                       help="how the router picks a replica (default round-robin; "
                            f"{DATA_PARALLEL_ROUTER} over data-parallel engines)")
    group.add_argument("--pd", default=None, metavar="P:D",
                       help="prefill/decode disaggregation: P prefill and D decode engines "
                            "instead of --replicas")
    group.add_argument("--kv-link-gbps", type=float, default=DEFAULT_KV_LINK_GBPS,
                       help="each prefill engine's KV link under --pd, Gb/s "
                            f"(default {DEFAULT_KV_LINK_GBPS:g}: a 400 Gb/s NIC)")


def parse_pd(text: str) -> tuple[int, int]:
    """'1:3' -> (1, 3)."""
    try:
        prefill, decode = (int(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(f"--pd takes P:D engine counts such as 1:3, got {text!r}") from None
    if prefill < 1 or decode < 1:
        raise ValueError(f"--pd needs at least one engine of each kind, got {text!r}")
    return prefill, decode


def cluster_from_args(args: argparse.Namespace,
                      deployment: Deployment) -> ClusterConfig | None:
    """The ClusterConfig the flags describe; None for one engine (the single-engine path).
    Data-parallel ranks are engines of their own: --replicas x --data-parallel-size."""
    dp = deployment.parallel.data_parallel
    if args.pd is None and args.replicas * dp == 1:
        return None
    if args.pd is not None and args.replicas != 1:
        raise ValueError("give either --replicas or --pd, not both")
    if args.pd is not None and dp != 1:
        raise ValueError("give either --pd or --data-parallel-size, not both")
    prefill, decode = parse_pd(args.pd) if args.pd is not None else (0, 0)
    router = args.router or (DATA_PARALLEL_ROUTER if dp > 1 else "round-robin")
    return ClusterConfig(num_replicas=args.replicas * dp, router=RouterConfig(router),
                         num_prefill=prefill, num_decode=decode,
                         kv_link_gbps=args.kv_link_gbps,
                         kv_bytes_per_token=deployment.kv_bytes_per_token)


def describe_cluster(cluster: ClusterConfig | None) -> str:
    """A few words for the run's header line."""
    if cluster is None:
        return "1 engine"
    if cluster.disaggregated:
        return (f"P/D {cluster.num_prefill}:{cluster.num_decode}, KV link "
                f"{cluster.kv_link_gbps:g} Gb/s, router {cluster.router.name}")
    return f"{cluster.num_replicas} replicas, router {cluster.router.name}"
