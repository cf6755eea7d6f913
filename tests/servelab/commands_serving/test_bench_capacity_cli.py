"""`bench-serve --find-capacity` against an in-process simulated server whose every step takes
a set time: one request at a time, 40 ms each (a prefill and three decodes of 10 ms), so it
holds a p99 TTFT of 100 ms with a wide margin at 5 req/s (10 ms) and breaks it by far at
80 req/s (most requests wait 100-250 ms), however fast the machine runs the test."""

from __future__ import annotations

import json

import pytest

from servelab.cli import main
from servelab.serve.engine_thread import EngineThreadConfig
from servelab.serve.server import ServerThread, assemble
from servelab.serve.simulated import SimulatedBackend, round_trip_token_ids
from servelab.serve.state import ApiConfig
from servelab.serve.tokenizer import ByteTokenizer
from sim.cost.fixed_backend import ConstantBackend
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig

TRACE = "synthetic:n=10,rate=5,arrival=constant,prompt=fixed(8),output=fixed(4)"


def one_at_a_time_server() -> ServerThread:
    tokenizer = ByteTokenizer()
    config = SchedulerConfig(policy="continuous", num_blocks=64, block_size=16,
                             max_num_seqs=1, max_model_len=64)
    backend = SimulatedBackend(ConstantBackend(step_s=0.010), round_trip_token_ids(tokenizer))
    state = assemble(Scheduler(config), backend, tokenizer, tokenizer.vocab_size,
                     ApiConfig("sim", 64), EngineThreadConfig())
    return ServerThread(state)


def find_capacity(url: str, tmp_path, *extra: str) -> int:
    return main(["bench-serve", "--url", url, "--trace", TRACE, "--find-capacity",
                 "--slo-ttft-p99-ms", "100", "--slo-itl-p99-ms", "1000",
                 "--capacity-start-rate", "5", "--capacity-growth", "16",
                 "--capacity-tolerance", "20", "--out", str(tmp_path / "cap"),
                 "--json", str(tmp_path / "cap.json"), *extra])


def test_find_capacity_reports_the_highest_rate_that_held(tmp_path, capsys):
    with one_at_a_time_server() as server:
        code = find_capacity(server.url, tmp_path)
    printed = capsys.readouterr().out
    assert code == 0
    result = json.loads((tmp_path / "cap.json").read_text())
    verdicts = [stage["verdict"] for stage in result["stages"]]
    assert verdicts[0] == "pass" and verdicts[1] in ("fail", "fail (early)")
    assert [round(s["rate_rps"], 6) for s in result["stages"]] == [5.0, 80.0]
    assert result["capacity"]["rate_rps"] == pytest.approx(5.0)
    assert result["capacity"]["ended"] == "bracketed"
    assert "capacity: 5 req/s" in printed and "pass" in printed
    assert (tmp_path / "cap" / "latency_vs_load.png").stat().st_size > 0
    assert (tmp_path / "cap" / "stages.csv").read_text().count("\n") == 3


def test_find_capacity_within_a_budget_too_short_for_a_stage_reports_none(tmp_path, capsys):
    """A 0.5 s budget cuts the first 2 s stage: no verdict, no capacity, still a report."""
    with one_at_a_time_server() as server:
        code = find_capacity(server.url, tmp_path, "--capacity-budget-s", "0.5")
    assert code == 0
    result = json.loads((tmp_path / "cap.json").read_text())
    assert result["capacity"] == {**result["capacity"], "rate_rps": 0.0, "ended": "budget"}
    assert [s["verdict"] for s in result["stages"]] == ["cut (budget)"]
    assert "stopped by the time budget" in capsys.readouterr().out


@pytest.mark.parametrize("flag, value, message", [
    ("--slo-ttft-p99-ms", "0", "--slo-ttft-p99-ms: expected a number > 0"),
    ("--capacity-growth", "1", "growth must be > 1"),
    ("--capacity-budget-s", "-1", "--capacity-budget-s: expected a number > 0"),
])
def test_bad_capacity_options_are_one_line_naming_the_option(tmp_path, capsys, flag, value,
                                                             message):
    with one_at_a_time_server() as server:
        code = find_capacity(server.url, tmp_path, flag, value)
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "cap.json").exists()
