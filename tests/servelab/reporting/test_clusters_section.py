"""The clusters section on small traces: consistent numbers, findings that hold, charts."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from servelab.reporting.clusters import clusters
from workloads import load_bundled
from workloads.transforms import head

CONV_REQUESTS, MOONCAKE_REQUESTS = 400, 200


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    out = tmp_path_factory.mktemp("clusters")
    return clusters(out, workers=1, conv=head(load_bundled("azure-conv"), CONV_REQUESTS),
                    mooncake=head(load_bundled("mooncake-synthetic"), MOONCAKE_REQUESTS),
                    replicas=(1, 2, 4), pd_scales=(4.0, 16.0))


def test_clusters_every_run_accounts_for_every_request(section):
    data = section.data
    assert data["replicas"] == [1, 2, 4]
    sizes = {"conv": CONV_REQUESTS, "mooncake": MOONCAKE_REQUESTS}
    for trace, routers in data["by_router"].items():
        assert list(routers) == data["routers"]
        for runs in routers.values():
            assert list(runs) == ["1", "2", "4"]
            assert all(s["completed"] + s["rejected"] == sizes[trace] for s in runs.values())
        one_engine = {json.dumps(runs["1"], sort_keys=True) for runs in routers.values()}
        assert len(one_engine) == 1  # one replica: the same single-engine run for every router
    assert all(s["rejected"] == 0 for runs in data["by_router"]["mooncake"].values()
               for s in runs.values())  # max_model_len 200,000 holds every prompt
    for by_scale in data["by_deployment"].values():
        assert list(by_scale) == ["4.0", "16.0"]
        assert all(s["completed"] + s["rejected"] == CONV_REQUESTS for s in by_scale.values())
    json.dumps(data)  # the summary JSON can hold it


def test_clusters_more_replicas_never_raise_p99_ttft_much(section):
    for trace, routers in section.data["by_router"].items():
        for router, runs in routers.items():
            p99 = [runs[n]["p99_ttft_ms"] for n in ("1", "2", "4")]
            assert all(b <= 1.1 * a for a, b in pairwise(p99)), (trace, router, p99)
            assert p99[-1] < p99[0] / 2, (trace, router, p99)  # one engine is overloaded


def test_clusters_prefix_aware_router_finds_more_cached_prefixes(section):
    conv, moon = section.data["by_router"]["conv"], section.data["by_router"]["mooncake"]
    # azure-conv has no prompt contents to share; mooncake does.
    assert all(s["prefix_cache_hit_rate"] == 0 for r in conv.values() for s in r.values())
    assert moon["prefix-aware"]["4"]["prefix_cache_hit_rate"] > \
        moon["round-robin"]["4"]["prefix_cache_hit_rate"] > 0
    rr, pa = moon["round-robin"]["4"], moon["prefix-aware"]["4"]
    assert (f"from {rr['prefix_cache_hit_rate']:.0%} to {pa['prefix_cache_hit_rate']:.0%}"
            in section.finding)


def test_clusters_pd_trades_ttft_for_itl(section):
    data = section.data
    top = {label: by["16.0"] for label, by in data["by_deployment"].items()}
    colocated = top.pop("4 co-located")
    assert all(s["p99_itl_ms"] < colocated["p99_itl_ms"] / 2 for s in top.values())
    assert top["P/D 1:3"]["p99_ttft_ms"] > top["P/D 2:2"]["p99_ttft_ms"]  # one prefill engine
    # 16x on 4 co-located replicas is the same run in both experiments.
    assert colocated == data["by_router"]["conv"]["least-requests"]["4"]
    rate = 16.0 * data["trace_rate_rps"]["conv"]
    under = data["pd_rate_under_target_rps"]
    for label, by in data["by_deployment"].items():
        assert (under[label] == pytest.approx(rate)) == (by["16.0"]["p99_ttft_ms"] <= 2000)
    assert f"from {colocated['p99_itl_ms']:.0f} ms" in section.finding


def test_clusters_charts_and_body(section):
    assert [p.name for p in section.images] == ["clusters_replicas.png", "clusters_pd.png"]
    assert all(p.stat().st_size > 20_000 for p in section.images)
    body = section.body
    assert "--replicas 4 --router prefix-aware" in body and "--pd 2:2" in body
    assert body.count("| 2 | least-kv |") == 2  # a row per router x replicas, per trace
    assert "| 1 | none (one engine) |" in body
