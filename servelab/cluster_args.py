"""Arguments that put several engines behind a router: replicas, P/D split, KV link."""

from __future__ import annotations

import argparse

from sim.cluster import DEFAULT_KV_LINK_GBPS, ClusterConfig
from sim.core import Backend
from sim.cost_model import DTYPE_BYTES, AnalyticCostModel
from sim.model_specs import model_spec
from sim.router import ROUTERS, RouterConfig


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    """--replicas, --router, --pd, --kv-link-gbps."""
    group = parser.add_argument_group("cluster")
    group.add_argument("--replicas", type=int, default=1,
                       help="engines behind the router, each with its own scheduler and KV "
                            "pool (default 1)")
    group.add_argument("--router", default="round-robin", choices=ROUTERS,
                       help="how the router picks a replica (default round-robin)")
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


def cluster_from_args(args: argparse.Namespace, backend: Backend) -> ClusterConfig | None:
    """The ClusterConfig the flags describe; None for one engine (the single-engine path)."""
    if args.pd is None and args.replicas == 1:
        return None
    if args.pd is not None and args.replicas != 1:
        raise ValueError("give either --replicas or --pd, not both")
    prefill, decode = parse_pd(args.pd) if args.pd is not None else (0, 0)
    return ClusterConfig(num_replicas=args.replicas, router=RouterConfig(args.router),
                         num_prefill=prefill, num_decode=decode,
                         kv_link_gbps=args.kv_link_gbps,
                         kv_bytes_per_token=kv_bytes_per_token(args, backend))


def kv_bytes_per_token(args: argparse.Namespace, backend: Backend) -> int:
    """K and V bytes of one token: the analytic model's own, else the --model preset's."""
    if isinstance(backend, AnalyticCostModel):
        return backend.model.kv_bytes_per_token(backend.dtype_bytes)
    return model_spec(args.model).kv_bytes_per_token(DTYPE_BYTES.get(args.dtype, 2))


def describe_cluster(cluster: ClusterConfig | None) -> str:
    """A few words for the run's header line."""
    if cluster is None:
        return "1 engine"
    if cluster.disaggregated:
        return (f"P/D {cluster.num_prefill}:{cluster.num_decode}, KV link "
                f"{cluster.kv_link_gbps:g} Gb/s, router {cluster.router.name}")
    return f"{cluster.num_replicas} replicas, router {cluster.router.name}"
