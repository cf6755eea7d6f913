"""The same multi-turn spec in `simulate` and through `bench-serve` against `servelab serve
--simulate`: both send each turn after the previous answer, and the live prefix cache finds
what the simulated one finds, the previous answers included."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.cli import main

ROOT = Path(__file__).resolve().parents[3]
# Conversations only (no shared system prompt): a turn's hits are its own history, whatever
# the order the server happens to see the sessions in; a pool that never evicts.
CHAT = ("synthetic:users=6,rate=20,turns=fixed(3),think=fixed(0.02),question=fixed(70),"
        "output=fixed(23)")


@pytest.fixture
def server_url():
    process = subprocess.Popen(
        [sys.executable, "-m", "servelab", "serve", "--simulate", "--model", "llama-3-8b",
         "--port", "0"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stderr.readline()
        match = re.search(r"listening on (http://\S+)", line)
        assert match, line
        yield match.group(1)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        process.stderr.close()


def test_live_and_simulated_prefix_hits_agree_on_a_conversation(server_url, tmp_path, capsys):
    live_json, sim_json = tmp_path / "live.json", tmp_path / "sim.json"
    assert main(["bench-serve", "--url", server_url, "--trace", CHAT,
                 "--json", str(live_json)]) == 0
    assert main(["simulate", "--trace", CHAT, "--model", "llama-3-8b",
                 "--json", str(sim_json)]) == 0
    capsys.readouterr()
    live = next(iter(json.loads(live_json.read_text())["results"].values()))
    # Naming the model runs vLLM's engine (chunked), on the server as in the simulator.
    simulated = json.loads(sim_json.read_text())["results"]["chunked"]
    assert live["completed"] == simulated["completed"] == 18
    # Turn k finds turn k-1's prompt and all its answer but the sampled last token, in full
    # 16-token blocks: none of a first turn's 70 tokens, then 80 of 163 (turn 0 computed
    # 70 + 23 - 1 = 92 tokens) and 176 of 256 (turn 1 computed 163 + 23 - 1 = 185).
    assert simulated["prefix_cache_hit_rate"] == pytest.approx((80 + 176) / (70 + 163 + 256))
    assert live["prefix_cache_hit_rate"] == pytest.approx(simulated["prefix_cache_hit_rate"])
