"""`servelab run --speculative-config`: acceptance and the speedup over the same run without
speculation are reported; a bad config is one clear error."""

from __future__ import annotations

import json

from servelab.cli import main
from tests.servelab.commands.test_model_cli import MODEL, TRACE

NGRAM = ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
         '"prompt_lookup_min": 2}')


def test_run_reports_acceptance_and_speedup(tmp_path, capsys):
    saved = tmp_path / "run.json"
    code = main(["run", "--trace", TRACE, "--policy", "continuous", "--max-num-seqs", "8",
                 *MODEL, "--speculative-config", NGRAM, "--json", str(saved)])
    assert code == 0, capsys.readouterr().err
    assert "speculation: acceptance rate" in capsys.readouterr().out
    payload = json.loads(saved.read_text())
    result = payload["results"]["continuous"]
    assert 0.0 <= result["spec_acceptance_rate"] <= 1.0
    assert result["spec_num_draft_tokens"] >= result["spec_num_accepted_tokens"]
    assert result["spec_tpot_speedup"] > 0 and result["spec_throughput_speedup"] > 0
    assert payload["config"]["scheduler"]["continuous"]["speculative"]["method"] == "ngram"
    # each request's counters, which sum to the run's (a simulation calibrates from them)
    per_request = result["spec_per_request"].values()
    assert sum(r["num_drafts"] for r in per_request) == result["spec_num_drafts"]
    assert [sum(r["accepted_per_pos"][i] for r in per_request) for i in range(4)] == [
        round(rate * result["spec_num_drafts"]) for rate in result["spec_acceptance_rates"]]


def test_run_rejects_a_bad_speculative_config(capsys):
    code = main(["run", "--trace", TRACE, *MODEL, "--speculative-config", '{"k": 4}'])
    assert code != 0
    assert "unknown keys" in capsys.readouterr().err


def test_run_with_a_draft_model_reports_its_acceptance(tmp_path, capsys):
    """The target's own first layer as the drafter: proposals found for every decoding row
    that may speculate, acceptance and speedups reported."""
    saved = tmp_path / "run.json"
    spec = '{"method": "draft_model", "draft_num_layers": 1, "num_speculative_tokens": 3}'
    code = main(["run", "--trace", TRACE, "--policy", "chunked", "--max-num-seqs", "8",
                 *MODEL, "--speculative-config", spec, "--json", str(saved)])
    assert code == 0, capsys.readouterr().err
    result = json.loads(saved.read_text())["results"]["chunked"]
    assert result["spec_num_drafts"] > 0
    assert result["spec_acceptance_rates"] == result["spec_acceptance_rates_per_decode"]
    assert result["spec_tpot_speedup"] > 0


def test_run_names_a_missing_draft_model_and_refuses_eagle(capsys):
    spec = '{"method": "draft_model", "model": "no-such-preset"}'
    assert main(["run", "--trace", TRACE, *MODEL, "--speculative-config", spec]) != 0
    assert "draft model 'no-such-preset'" in capsys.readouterr().err
    spec = '{"method": "eagle", "num_speculative_tokens": 2}'
    assert main(["run", "--trace", TRACE, *MODEL, "--speculative-config", spec]) != 0
    assert "simulation only" in capsys.readouterr().err
