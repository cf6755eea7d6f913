"""AIConfigurator's own prediction of its measured H100 vLLM runs, beside servelab's replay.

The rows are the shipped silicon rows (sim/data/aiconfigurator/SILICON.md). AIConfigurator
0.12.0 runs in its own virtual environment (created and installed with pip on first use)
and predicts each row offline through its Python API (`cli_estimate`, the call its own
silicon accuracy tool makes), from the row's own fields. servelab replays the same rows
(`servelab fidelity-gpu --silicon-only`). Both errors are printed with the same
statistics: per model, TP and precision, the signed median and the p90 of |error| of mean
TTFT and TPOT, on the rows both predict; then each side's refusals.

Run: python benchmarks/aiconfigurator_peer.py [--venv DIR] [--rounds N] [--json FILE]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.measured.silicon import (  # noqa: E402
    RowResult,
    error_table,
    format_error_table,
    format_refusals,
    simulate_rows,
)
from sim.measured.silicon_rows import (  # noqa: E402
    MEASURED_ROUNDS,
    ROWS_CSV,
    load_rows,
)

PEER = "aiconfigurator==0.12.0"
DEFAULT_VENV = Path.home() / ".cache" / "servelab" / "aiconfigurator-0.12.0"
# AIConfigurator ships Llama-3.1-70B's config under the Hub's former name (its own
# InferenceX adapter maps the model there); offline it cannot fetch the new one.
MODEL_ALIASES = {"meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B"}
# The row fields AIConfigurator's silicon tool passes, as ints, where the row has them.
INT_FIELDS = ("batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size",
              "moe_ep_size")
# Runs inside the peer's venv: estimate args on stdin, one prediction or error per row on
# stdout (its own logging goes to stderr).
DRIVER = r"""
import contextlib, json, sys
from aiconfigurator.cli.api import cli_estimate
out = []
for args in json.load(sys.stdin):
    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = cli_estimate(**args)
        out.append({"ttft_ms": float(result.ttft), "tpot_ms": float(result.tpot)})
    except Exception as error:  # the peer's refusal, in its own words
        out.append({"error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"})
json.dump(out, sys.stdout)
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV,
                        help=f"the peer's virtual environment (default {DEFAULT_VENV})")
    parser.add_argument("--rounds", type=int, default=MEASURED_ROUNDS,
                        help="servelab's measured rounds per user (default as measured)")
    parser.add_argument("--json", type=Path, default=None, help="write both sides' rows")
    return parser.parse_args()


def ensure_venv(venv: Path) -> Path:
    """The peer venv's python, with PEER installed (created on first use)."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import aiconfigurator.cli.api"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"creating {venv} and installing {PEER}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", PEER], check=True)
    return python


def estimate_args(record: dict[str, str]) -> dict:
    """cli_estimate's arguments for one shipped CSV record, as AIConfigurator's silicon
    tool builds them. backend_version None: 0.12.0 queries its one H100 vLLM database
    (the rows' own vLLM versions are not queryable versions there)."""
    model = record["model_path"]
    return {"model_path": MODEL_ALIASES.get(model, model), "system_name": "h100_sxm",
            "mode": "agg", "backend_name": "vllm", "backend_version": None,
            "isl": int(record["isl"]), "osl": int(record["osl"]),
            "gemm_quant_mode": record["gemm_quant_mode"] or None,
            "moe_quant_mode": record["moe_quant_mode"] or None,
            **{field: int(record[field]) for field in INT_FIELDS if record[field]}}


def peer_predictions(python: Path, log: Path) -> list[dict]:
    """One prediction (or error) per shipped row, in file order."""
    with ROWS_CSV.open(newline="") as f:
        args = [estimate_args(record) for record in csv.DictReader(f)]
    with log.open("w") as stderr:
        done = subprocess.run([str(python), "-c", DRIVER], input=json.dumps(args),
                              stdout=subprocess.PIPE, stderr=stderr, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{PEER} driver exited {done.returncode}; its log: {log}")
    return json.loads(done.stdout)


def side_by_side(ours: list[RowResult], peer: list[RowResult]) -> str:
    """Both error tables on the rows both predict, one line per group."""
    both = [i for i, (a, b) in enumerate(zip(ours, peer, strict=True))
            if a.simulated and b.simulated]
    if not both:
        return "no row is predicted by both"
    mine, theirs = error_table([ours[i] for i in both]), error_table([peer[i] for i in both])
    lines = [f"{'model':<26}{'TP':>3} {'prec':<5}{'rows':>5}"
             + "".join(f"{m + ' ' + s:>17}" for m in ("TTFT", "TPOT")
                       for s in ("servelab", "AIC")),
             f"{'':<39}(each: signed median / p90 |error|)"]
    for a, b in zip(mine, theirs, strict=True):
        cells = [f"{g[m + '_median']:+.0%} / {g[m + '_p90_abs']:.0%}"
                 for m in ("ttft", "tpot") for g in (a, b)]
        lines.append(f"{a['model']:<26}{a['tp']!s:>3} {a['precision']:<5}{a['rows']:>5}"
                     + "".join(f"{c:>17}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    python = ensure_venv(args.venv)
    rows = load_rows()
    predicted = peer_predictions(python, args.venv / "predict.log")
    peer = [RowResult(row, p.get("ttft_ms"), p.get("tpot_ms"), p.get("error", ""))
            for row, p in zip(rows, predicted, strict=True)]
    ours = simulate_rows(rows, rounds=args.rounds)
    counts = Counter((a.simulated, b.simulated) for a, b in zip(ours, peer, strict=True))
    print(f"{len(rows)} H100 vLLM rows: servelab predicts {sum(r.simulated for r in ours)}, "
          f"{PEER} predicts {sum(r.simulated for r in peer)}, both {counts[(True, True)]}")
    print("\nOn the rows both predict:")
    print(side_by_side(ours, peer))
    for name, results in (("servelab", ours), (PEER, peer)):
        print(f"\n{name}, every row it predicts:")
        print(format_error_table(error_table(results)))
        print(format_refusals(results))
    if args.json is not None:
        args.json.write_text(json.dumps([
            {"id": a.row.row_id, "measured": [a.row.ttft_ms, a.row.tpot_ms],
             "servelab": [a.ttft_ms, a.tpot_ms], "servelab_refused": a.refused,
             "aiconfigurator": [b.ttft_ms, b.tpot_ms], "aiconfigurator_refused": b.refused}
            for a, b in zip(ours, peer, strict=True)], indent=1) + "\n")


if __name__ == "__main__":
    main()
