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


def test_run_rejects_a_bad_speculative_config(capsys):
    code = main(["run", "--trace", TRACE, *MODEL, "--speculative-config", '{"k": 4}'])
    assert code != 0
    assert "unknown keys" in capsys.readouterr().err
