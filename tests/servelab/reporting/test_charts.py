"""Charts from small real simulations: four valid PNGs, also for a run that rejected all."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.reporting.charts.basic import RunTables, write_charts
from sim.cost.fixed_backend import ConstantBackend
from sim.engine.core import Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.metrics import inter_token_latencies_ms, request_table, step_table, summarize
from sim.replay.simulation import run_trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHART_NAMES = {"ttft_cdf.png", "itl_cdf.png", "throughput_latency.png", "timeline.png"}


def make_requests(count: int, prompt_len: int = 40) -> list[Request]:
    return [
        Request(f"r{i}", 0.05 * i, prompt_len + 7 * (i % 5), 5 + 3 * (i % 7)) for i in range(count)
    ]


def simulate(config: SchedulerConfig, requests: list[Request]) -> RunTables:
    engine = Engine(Scheduler(config), ConstantBackend(step_s=0.01, per_token_s=1e-5))
    result = run_trace(requests, engine)
    return RunTables(
        summary=summarize(result),
        requests=request_table(result.requests),
        steps=step_table(result.steps),
        itl_ms=inter_token_latencies_ms(result.requests),
        num_blocks=result.num_blocks,
    )


def assert_valid_pngs(paths: list[Path], out_dir: Path) -> None:
    assert {p.name for p in paths} == CHART_NAMES
    for path in paths:
        assert path.parent == out_dir
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC, path
        assert len(data) > 10_000, path  # a drawn chart, not an empty canvas


def test_write_charts_writes_four_valid_pngs_for_two_policies(tmp_path):
    runs = {
        policy: simulate(
            SchedulerConfig(policy=policy, num_blocks=64, max_model_len=256), make_requests(40)
        )
        for policy in ("continuous", "chunked")
    }
    out_dir = tmp_path / "charts"  # created by write_charts
    paths = write_charts(runs, out_dir, "40 requests, constant backend")
    assert_valid_pngs(paths, out_dir)


def test_write_charts_survives_a_policy_whose_requests_were_all_rejected(tmp_path):
    rejected = simulate(
        SchedulerConfig(policy="static", num_blocks=64, max_model_len=64),
        make_requests(10, prompt_len=100),
    )
    assert rejected.summary["rejected"] == 10 and rejected.steps.empty
    ok = simulate(
        SchedulerConfig(policy="continuous", num_blocks=64, max_model_len=256), make_requests(10)
    )
    paths = write_charts({"static": rejected, "continuous": ok}, tmp_path, "")
    assert_valid_pngs(paths, tmp_path)


def test_write_charts_survives_runs_with_no_steps_at_all(tmp_path):
    rejected = simulate(
        SchedulerConfig(policy="chunked", num_blocks=64, max_model_len=64),
        make_requests(3, prompt_len=100),
    )
    paths = write_charts({"chunked": rejected}, tmp_path, "all rejected")
    assert {p.name for p in paths} == CHART_NAMES
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths)


def test_write_charts_rejects_an_empty_run_set(tmp_path):
    with pytest.raises(ValueError, match="no runs"):
        write_charts({}, tmp_path, "nothing")
