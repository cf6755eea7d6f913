"""Charts read without the command line: identical series told apart and noted, and a title
that states the finding and the run."""

from __future__ import annotations

import numpy as np

from servelab.reporting.charts.plan_chart import plan_chart, plan_figure
from servelab.reporting.charts.series import extremes, identical_to, ms_text, series_styles
from servelab.reporting.charts.timeline_chart import timeline_chart
from sim.engine.scheduler import SchedulerConfig
from tests.servelab.reporting.test_charts import make_requests, simulate


def test_every_policy_gets_its_own_colour_dashes_and_marker():
    styles = series_styles(["static", "continuous", "recompute", "chunked"])
    looks = {(s.color, s.linestyle, s.marker) for s in styles.values()}
    assert len({s.linestyle for s in styles.values()}) == 4 and len(looks) == 4


def test_identical_series_name_their_earlier_twin():
    values = {"a": np.array([1.0, np.nan]), "b": np.array([1.0, np.nan]),
              "c": np.array([2.0, 3.0])}
    assert identical_to(values) == {"b": "a"}


def test_findings_name_best_and_worst_and_share_ties():
    medians = {"static": 287_000.0, "continuous": 40.3, "recompute": 40.3, "chunked": 41.0}
    assert extremes(medians, "median TTFT", ms_text, low_is_best=True) == (
        "median TTFT: best continuous, recompute (40.3 ms), worst static (287 s)")
    assert extremes({"a": 5.0, "b": 5.0}, "p99 ITL", ms_text, True) == (
        "p99 ITL: 5 ms (every policy)")
    assert extremes({"a": None}, "p99 ITL", ms_text, True) == "no p99 ITL"


def test_timeline_notes_twins_and_titles_the_run_and_its_finding():
    config = SchedulerConfig(policy="continuous", num_blocks=64, max_model_len=256)
    run = simulate(config, make_requests(30))
    twin = simulate(SchedulerConfig(policy="recompute", num_blocks=64, max_model_len=256),
                    make_requests(30))
    runs = {"continuous": run, "recompute": twin}
    fig = timeline_chart(runs, series_styles(list(runs)), "trace at 20 req/s; m on g")
    labels = [text.get_text() for legend in fig.legends for text in legend.get_texts()]
    assert labels == ["continuous", "recompute, identical to continuous"]
    title = fig.get_suptitle()
    assert title.startswith("peak waiting queue") and "trace at 20 req/s; m on g" in title


def test_plan_chart_labels_axes_legend_and_finding(tmp_path):
    import pandas as pd

    probes = pd.DataFrame({"hardware": ["h100", "h100", "a100"], "usd_per_hour": [6, 12, 4],
                           "p99_ttft_ms": [500.0, 200.0, 3000.0],
                           "meets_slo": [True, True, False]})
    fig = plan_figure(probes, probes.iloc[[0]], 2000, "conv")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "deployment price ($ per hour, log)"
    assert ax.get_ylabel() == "p99 TTFT (ms, log)"
    legend = ax.get_legend()
    assert legend.get_title().get_text() == "GPU type (colour)"
    assert "hollow: misses the SLO" in [t.get_text() for t in legend.get_texts()]
    assert fig.get_suptitle().startswith("cheapest meeting the SLO: h100 at $6.00/h")
    assert plan_chart(probes, probes.iloc[[0]], 2000, tmp_path, "conv").is_file()
