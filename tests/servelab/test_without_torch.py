"""The base install simulates, plans and serves --simulate without torch: the CLI and those
commands never import it (the executor extra adds it for run, calibrate, validate, serve)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
from servelab.cli import build_parser, main
from servelab.commands.serve import _simulated_parts
from servelab.serve.tokenizer import load_tokenizer
assert main(["simulate", "--trace", "azure-code", "--max-requests", "20"]) == 0
assert main(["plan", "--help"]) == 0
_simulated_parts(build_parser().parse_args(["serve", "--simulate"]), load_tokenizer(None))
loaded = sorted(m for m in ("torch", "safetensors") if m in sys.modules)
assert not loaded, loaded
"""


def test_simulate_plan_and_serve_simulate_never_import_torch() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
