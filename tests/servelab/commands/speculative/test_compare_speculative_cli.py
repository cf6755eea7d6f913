"""`servelab compare --speculative`: each policy across rates with and without speculation,
the crossover where it stops paying, and its chart."""

from __future__ import annotations

import json

import pytest

from servelab.cli import main
from servelab.sweeps.speculative import crossover, describe_crossover

TRACE = "synthetic:n=40,rate=4,prompt=uniform(100,400),output=uniform(20,80)"
LOW_ACCEPTANCE = ('{"method": "ngram", "num_speculative_tokens": 4, '
                  '"acceptance_rates": [0.1, 0.02, 0.0, 0.0]}')


def test_compare_speculative_writes_the_crossover_and_its_chart(tmp_path, capsys):
    saved, out = tmp_path / "cmp.json", tmp_path / "out"
    code = main(["compare", "--trace", TRACE, "--speculative", LOW_ACCEPTANCE,
                 "--qps-scales", "2,16", "--workers", "1", "--json", str(saved),
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    payload = json.loads(saved.read_text())
    assert payload["config"]["qps_scales"] == [1.0, 2.0, 16.0]  # the trace's own rate added
    assert payload["config"]["speculative"]["acceptance_rates"] == [0.1, 0.02, 0.0, 0.0]
    (policy,) = payload["results"]  # the default deployment's default policy
    assert payload["results"][policy]["spec_mean_accepted_length"] == pytest.approx(1.12)
    assert "spec_tpot_speedup" in payload["results"][policy]
    sweep = payload["speculative_sweep"]
    assert [r["qps_scale"] for r in sweep] == [1.0, 2.0, 16.0]
    assert len(payload["speculative_runs"]) == 6  # each rate with and without
    for row in sweep:
        assert row["tpot_speedup"] == pytest.approx(
            row["plain_mean_tpot_ms"] / row["spec_mean_tpot_ms"])
    record = payload["crossover"][policy]
    assert set(record) == {"state", "rate_rps", "qps_scale", "bracket_rps", "range_rps"}
    assert record["range_rps"] == [sweep[0]["rate_rps"], sweep[-1]["rate_rps"]]
    # The verdict follows from the rows: this one agrees with its own speedups.
    assert record == crossover(sweep)
    assert describe_crossover(policy, record) in printed
    assert "acceptance per position [0.1, 0.02, 0, 0] assumed" in printed
    chart = out / "speculative_crossover.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "speculative_sweep.csv").exists() and (out / "summary.json").exists()


def rows(speedups: list[float]) -> list[dict]:
    return [{"policy": "chunked", "qps_scale": float(2 ** i), "rate_rps": 3.0 * 2 ** i,
             "tpot_speedup": s} for i, s in enumerate(speedups)]


def test_crossover_interpolates_where_the_tpot_speedup_crosses_one():
    record = crossover(rows([2.0, 1.5, 0.5, 0.9]))
    assert record["state"] == "crossover"
    assert record["bracket_rps"] == [6.0, 12.0]
    assert record["rate_rps"] == pytest.approx(6.0 + 0.5 * 6.0)  # 1.5 -> 0.5: halfway
    assert record["qps_scale"] == pytest.approx(3.0)
    assert "stops paying at ~9.00 req/s" in describe_crossover("chunked", record)


@pytest.mark.parametrize(("speedups", "state", "words"), [
    ([2.0, 1.5, 1.1], "pays throughout", "no crossover in 3.00-12.00 req/s: speculation pays"),
    ([0.9, 1.2], "never pays", "slower already at the lowest rate"),
])
def test_no_crossover_in_range_is_said(speedups, state, words):
    record = crossover(rows(speedups))
    assert record["state"] == state and record["rate_rps"] is None
    assert words in describe_crossover("chunked", record)


@pytest.mark.parametrize(("argv", "message"), [
    (["--qps-scales", "1,2"], "--qps-scales: only with --speculative"),
    (["--speculative", LOW_ACCEPTANCE, "--speculative-config", LOW_ACCEPTANCE],
     "drop --speculative-config"),
    (["--speculative", '{"method": "ngram"}'], "needs acceptance_rates"),
    (["--speculative", LOW_ACCEPTANCE, "--policies", "static"], "not static"),
    (["--speculative", LOW_ACCEPTANCE, "--qps-scales", "1,x"], "comma-separated numbers"),
    (["--speculative", LOW_ACCEPTANCE, "--qps-scales", "0,1"], "finite and > 0"),
    (["--speculative", "{"], "not JSON"),
])
def test_compare_speculative_bad_input_is_one_line(argv, message, capsys):
    assert main(["compare", "--trace", TRACE, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
