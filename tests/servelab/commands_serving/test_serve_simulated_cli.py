"""`servelab serve --simulate`: starts without weights, answers, drains; bad flag mixes."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from servelab.cli import build_parser, main
from servelab.commands.serve import _simulated_parts, engine_figures
from servelab.serve.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parents[3]


def get(url: str, body: dict | None = None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=60) as response:  # (only a hung server reaches 60 s)
        return response.read()


def test_serve_simulate_answers_without_weights_and_drains_on_sigterm():
    process = subprocess.Popen(
        [sys.executable, "-m", "servelab", "serve", "--simulate", "--hardware", "h200",
         "--cost", "gpu", "--policy", "chunked", "--max-num-batched-tokens", "4096",
         "--port", "0"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stderr.readline()
        match = re.search(r"listening on (http://\S+)", line)
        assert match, line
        url = match.group(1)
        assert "llama-3-8b, simulated llama-3-8b on h200 (bf16); priced by gpu-fitted" in line
        assert "extrapolated from its datasheet" in line and "; chunked" in line
        # Every figure is the engine's: the budget given, not the default one.
        assert "token budget 4096" in line
        models = json.loads(get(f"{url}/v1/models"))
        assert models["data"][0]["id"] == "llama-3-8b"
        body = {"prompt": "hello", "max_tokens": 3, "seed": 7}
        text = json.loads(get(f"{url}/v1/completions", body))["choices"][0]["text"]
        assert len(ByteTokenizer().encode(text)) == 3
        events = get(f"{url}/v1/completions", {**body, "stream": True}).decode().split("\n\n")
        assert events[-2:] == ["data: [DONE]", ""]
        chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
        assert "".join(c["choices"][0]["text"] for c in chunks) == text  # the seed decides
        assert b"vllm:num_requests_running" in get(f"{url}/metrics")
        assert "torch" not in get_modules(process)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
        process.stderr.close()
    assert code == 0


def get_modules(process: subprocess.Popen) -> str:
    """The process's mapped files: torch's shared libraries show if it was imported."""
    return Path(f"/proc/{process.pid}/maps").read_text()


@pytest.mark.parametrize(("argv", "message"), [
    (["--hardware", "h100"], "--hardware: only with --simulate"),
    (["--cost-model", "c.json", "--tp", "2"], "--tp, --cost-model: only with --simulate"),
    (["--quantization", "fp8"], "--quantization: only with --simulate"),
    (["--simulate", "--device", "cpu", "--threads", "2"], "--device, --threads: not with"),
    (["--simulate", "--model", "no-such-model"], "no-such-model"),
    (["--simulate", "--hardware", "no-such-gpu"], "no-such-gpu"),
    (["--simulate", "--dtype", "float32"], "float32"),
    (["--simulate", "--speculative-config", '{"method": "ngram"}'], "needs acceptance_rates"),
    (["--simulate", "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 1, '
      '"acceptance_rates": [0.5]}'], "not priced yet"),
    (["--speculative-config", '{"method": "eagle"}'], "no drafter on the executor"),
    (["--simulate", "--speculative-config", "{"], "--speculative-config is not JSON"),
    (["--simulate", "--policy", "static", "--speculative-config",
      '{"num_speculative_tokens": 1, "acceptance_rates": [0.5]}'], "not static"),
])
def test_serve_simulate_rejects_flags_of_the_other_mode(argv, message, capsys):
    assert main(["serve", "--port", "0", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("budget", [1024, 8192])
def test_start_up_line_states_the_fitted_range_for_the_engines_own_budget(budget):
    args = build_parser().parse_args(["serve", "--simulate", "--cost", "gpu", "--policy",
                                      "chunked", "--max-num-batched-tokens", str(budget)])
    parts = _simulated_parts(args, ByteTokenizer())
    assert parts.scheduler.config.budget == budget
    assert f"steps up to {budget} tokens" in parts.where  # h100: inside the fitted data
    assert "steps up to 2048" not in parts.where


def test_start_up_line_names_the_speculation():
    args = build_parser().parse_args(["serve", "--simulate", "--speculative-config",
                                      '{"num_speculative_tokens": 2, "acceptance_rates": '
                                      '[0.5, 0.2]}'])
    parts = _simulated_parts(args, ByteTokenizer())
    assert engine_figures(parts.scheduler).endswith(", speculative ngram k=2")
