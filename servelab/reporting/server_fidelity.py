"""Report section: the simulator against a real server, calibrated from its URL.

Reads what `benchmarks/peers/server_fidelity.py` wrote (a calibration and one validation per
workload): running vLLM takes its own environment, so the report shows the committed run.
"""

from __future__ import annotations

import json
from pathlib import Path

from servelab.reporting.charts.fidelity_charts import error_bars
from servelab.reporting.sections import Section


def server_fidelity(source: Path, out: Path, server: str = "vLLM's CPU server") -> Section:
    """Per workload the median and worst |error| and the server's own spread, and the error
    of every metric (a chart)."""
    calibration = json.loads((source / "calibration.json").read_text())
    meta = calibration["meta"]
    runs = {path.stem: json.loads(path.read_text())
            for path in sorted(source.glob("*.json")) if path.name != "calibration.json"}
    if not runs:
        raise ValueError(f"{source}: no validations; run benchmarks/peers/server_fidelity.py")
    results = {name: next(iter(run["results"].values())) for name, run in runs.items()}
    rows = ["| workload | median \\|error\\| | worst | server's spread | replays |",
            "|---|---:|---:|---:|---:|"]
    for name, run in runs.items():
        o = run["overall"]
        rows.append(f"| {name} | {o['median_abs_error']:.1%} | {o['max_abs_error']:.1%} | "
                    f"{o['median_spread']:.1%} | {run['repeats']} |")
    medians = ", ".join(f"{name} {run['overall']['median_abs_error']:.0%}"
                        for name, run in runs.items())
    finding = (f"Calibrated from its URL in {meta['probing_s']:.0f} s, the simulator predicts "
               f"{server} with median |error| {medians}")
    server_meta = meta["server"]
    body = (
        f"{server} serving {meta['model']} at the limits it publishes and vLLM's defaults "
        f"(chunked prefill, {server_meta['token_budget']} tokens per step, max_num_seqs "
        f"{server_meta['max_num_seqs']}, {server_meta['num_blocks']} KV blocks of "
        f"{server_meta['block_size']}, prefix caching "
        f"{'on' if server_meta['enable_prefix_caching'] else 'off'}); "
        f"`servelab calibrate --url` probed it ({meta['probes']} probes, "
        f"{meta['observations']} observations, held-out error "
        f"{calibration['meta']['holdout_error']['median']:.1%}, request overhead "
        f"{calibration['request_overhead_s'] * 1e3:.1f} ms) and `servelab validate --url` "
        f"replayed each workload against it. The spread is how far the server's own replays "
        f"of one workload differ ((max - min) / median, the median over metrics): a floor "
        f"under what any simulator can match. Client and server shared one machine "
        f"({meta.get('client', '?')}).\n\n" + "\n".join(rows))
    path = error_bars(results, out, f"the simulator vs {server}, calibrated from its URL",
                      name="server_fidelity_errors.png")
    return Section(f"Simulator fidelity against {server}", finding, [path], body,
                   {name: run["overall"] for name, run in runs.items()})
