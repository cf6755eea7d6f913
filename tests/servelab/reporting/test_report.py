"""`servelab report` sections on small inputs: charts written, findings that hold, markdown."""

from __future__ import annotations

import json

import pytest

from servelab.reporting import sections
from servelab.reporting.capacity import latency_vs_load
from servelab.reporting.prefix_caching import prefix_caching
from servelab.reporting.report import write_markdown
from workloads import load_bundled
from workloads.transforms import head


def test_itl_spike_chunking_flattens_the_gap(tmp_path):
    section = sections.itl_spike(tmp_path, decoders=4, long_prompt=6000)
    worst = section.data["worst_gap_ms"]
    assert worst["continuous"] > 2 * worst["chunked, budget 2048"]
    assert worst["chunked, budget 2048"] > worst["chunked, budget 512"]
    assert f"{worst['continuous']:.0f} ms" in section.finding
    assert section.images[0].stat().st_size > 20_000


def test_undersized_pool_completes_everything(tmp_path):
    section = sections.starvation(tmp_path, requests=150, qps_scale=4.0, small_blocks=600)
    for pools in section.data.values():
        assert pools["undersized"]["completed"] == pools["default"]["completed"] == 150
    assert section.data["recompute"]["undersized"]["preemptions"] > 0
    assert "150 of 150 requests" in section.finding


def test_capacity_section_ranks_policies(tmp_path):
    section = latency_vs_load(tmp_path, workers=1, trace=head(load_bundled("azure-conv"), 300),
                              rates=(1.0, 8.0))
    rate = section.data["capacity_rps"]["default"]
    assert min(rate[p] for p in ("continuous", "recompute", "chunked")) > rate["static"]
    assert (tmp_path / "sweep.csv").exists() and (tmp_path / "latency_vs_load.png").exists()
    assert "static" in section.body  # the ordering is explained


def test_prefix_caching_hit_rate_grows_with_the_pool_up_to_the_ceiling(tmp_path):
    trace = head(load_bundled("mooncake-synthetic"), 300)
    section = prefix_caching(tmp_path, workers=1, trace=trace, pools=(10_000, 4_000_000))
    ceiling = section.data["ceiling"]
    by_pool = section.data["hit_rate_by_pool"]
    assert list(by_pool) == ["10000", str(section.data["default_pool_blocks"]), "4000000"]
    hits = list(by_pool.values())
    assert 0 < hits[0] < hits[1] < hits[2] <= ceiling + 1e-3
    assert hits[2] == pytest.approx(ceiling, abs=5e-3)  # nothing evicted: the ceiling
    runs = section.data["caching_on_off"]
    assert {k: s["prefix_cache_hit_rate"] for k, s in runs.items() if k.endswith("off")} == {
        f"{section.data['default_pool_blocks']:,} blocks, caching off": 0.0,
        "4,000,000 blocks, caching off": 0.0}
    on, off = runs["4,000,000 blocks, caching on"], runs["4,000,000 blocks, caching off"]
    assert on["median_ttft_ms"] < off["median_ttft_ms"]
    assert f"{ceiling:.0%}" in section.finding and "| 10,000 | 160,000 |" in section.body
    assert (tmp_path / "prefix_caching.png").stat().st_size > 20_000
    json.dumps(section.data)


def test_measured_sections_and_markdown(tmp_path):
    pytest.importorskip("torch")
    workload = sections.MeasuredWorkload(max_requests=10, length_scale=0.05, model="tiny")
    results, runs = sections.measured_vs_simulated(workload, ["static", "continuous"])
    assert results["static"]["measured"]["completed"] == 10
    batching = sections.static_vs_continuous(results, workload, tmp_path)
    fidelity = sections.fidelity(results, runs, workload, tmp_path)
    assert "median |error|" in fidelity.finding
    assert {p.name for p in fidelity.images} == {"fidelity_cdf.png", "fidelity_errors.png"}
    write_markdown(tmp_path / "report.md", [batching, fidelity], 12.0)
    text = (tmp_path / "report.md").read_text()
    assert "## 1. Static vs continuous" in text and "## 2. Simulator fidelity" in text
    assert "(figures/static_vs_continuous.png)" in text
    json.dumps(batching.data)  # the summary JSON can hold it


def test_server_fidelity_section_reads_the_committed_run(tmp_path):
    from servelab.reporting.server_fidelity import server_fidelity

    source = tmp_path / "vllm-server"
    source.mkdir()
    meta = {"probing_s": 111.0, "model": "peer", "probes": 31, "observations": 196,
            "holdout_error": {"median": 0.057}, "client": "a CPU",
            "server": {"token_budget": 2048, "max_num_seqs": 128, "num_blocks": 2048,
                       "block_size": 128, "enable_prefix_caching": True}}
    (source / "calibration.json").write_text(json.dumps(
        {"meta": meta, "request_overhead_s": 0.0086}))
    error = {"median_ttft_ms": -0.2, "p99_itl_ms": 0.05}
    for name, median in (("conv", 0.2), ("gamma", 0.08)):
        (source / f"{name}.json").write_text(json.dumps({
            "results": {"chunked": {"error": error}}, "repeats": 3,
            "overall": {"median_abs_error": median, "max_abs_error": 0.3,
                        "median_spread": 0.1}}))
    section = server_fidelity(source, tmp_path)
    assert "conv 20%, gamma 8%" in section.finding and "111 s" in section.finding
    assert "| gamma | 8.0% | 30.0% | 10.0% | 3 |" in section.body
    assert section.images[0].name == "server_fidelity_errors.png"
    assert section.images[0].stat().st_size > 0


def test_gpu_fidelity_section_counts_runs_and_cells_from_its_tables(tmp_path):
    from servelab.reporting.gpu_fidelity import gpu_fidelity_section
    section = gpu_fidelity_section(tmp_path)
    runs = {r["run"] for r in section.data["runs"]}
    held = sum(all(abs(r["our_error"]) <= 0.05 for r in section.data["runs"] if r["run"] == run)
               for run in runs)
    assert len(runs) == 4 and f"{held} of 4 real vLLM runs" in section.finding
    assert held >= 2  # both single-GPU runs: RTX 4090 and RTX PRO 6000 Llama-3.1-8B
    assert all(p.stat().st_size > 20_000 for p in section.images)
    assert section.body.count("| RTX4090/Llama-3.1-8B |") == 6


def test_sessions_section_shows_what_conversations_change(tmp_path):
    from servelab.reporting.sessions import sessions_section
    section = sessions_section(tmp_path, users=30, rate=1.0, replicas=2)
    one, routed = section.data["one_gpu"], section.data["routers"]
    assert one["chat"]["prefix_cache_hit_rate"] > 0.5
    assert one["single-turn"]["prefix_cache_hit_rate"] == 0.0
    assert (routed["prefix-aware"]["chat"]["prefix_cache_hit_rate"]
            > routed["round-robin"]["chat"]["prefix_cache_hit_rate"])
    assert f"{one['chat']['prefix_cache_hit_rate']:.0%} of its prompt tokens" in section.finding
    assert section.images[0].stat().st_size > 20_000
