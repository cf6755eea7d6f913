"""Calibration from a server's URL, checked against a server whose costs are known: the
simulator, running a known cost model with a request overhead, stands in for the server."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from servelab.calibration.remote import (
    Observations,
    ServerLimits,
    _decode_plan,
    error_by_kind,
    fit_observations,
    join_probes,
    median_decode_step,
    observe,
    outliers_by_kind,
    probes,
)
from sim.cost.calibrated import FEATURES, CalibratedCostModel, feature_names
from sim.engine.core import Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace

LIMITS = ServerLimits(max_model_len=4096, token_budget=1024, max_num_seqs=64)
COSTS = {"constant": 3e-3, "prefill_step": 1e-3, "tokens": 4e-5, "sampled": 2e-5,
         "seqs": 1e-5, "decode_kv": 3e-8, "prefill_attn_causal": 2e-9, "mixed_step": 6e-4}
TRUE = CalibratedCostModel(tuple(COSTS.get(name, 0.0) for name in FEATURES),
                           request_overhead_s=0.004)


def serve(probe, model=TRUE) -> list[Request]:
    """The probe's requests through a chunked scheduler priced by `model`, as a client sees
    them (every token stamped at the end of its step; a client's sends 0.2 ms apart)."""
    requests = [Request(f"r{j}", r.send_s + 2e-4 * j, r.prompt_len, r.max_tokens)
                for j, r in enumerate(probe.requests)]
    config = SchedulerConfig("chunked", num_blocks=4096, max_model_len=LIMITS.max_model_len,
                             max_num_seqs=LIMITS.max_num_seqs, token_budget=LIMITS.token_budget)
    run_trace(sorted(requests, key=lambda r: r.arrival_s), Engine(Scheduler(config), model))
    return requests


@pytest.fixture(scope="module")
def observed() -> Observations:
    out = Observations()
    for probe in probes(LIMITS):
        observe(probe, serve(probe), LIMITS, out)
    for probe in join_probes(LIMITS, median_decode_step(out)):
        observe(probe, serve(probe), LIMITS, out)
    return out


def test_every_kind_of_probe_is_observed(observed):
    assert set(observed.kinds) == {"lone TTFT", "decode", "mixed", "join TTFT", "burst TTFT",
                                   "burst"}
    assert observed.kinds.count("mixed") >= observed.kinds.count("join TTFT")


def test_the_fit_recovers_the_step_costs_and_the_request_overhead(observed):
    fit, kept = fit_observations(observed)
    assert kept.all()  # a server of known costs, seen exactly: nothing to leave out
    assert fit.model.request_overhead_s == pytest.approx(0.004, rel=0.15)
    assert np.median(fit.held_error) < 0.01
    errors = error_by_kind(observed, fit.held_error, kept)
    assert max(errors["decode"], errors["mixed"], errors["lone TTFT"], errors["burst"]) < 0.03
    assert errors["join TTFT"] < 0.1  # each join waited a different part of a step
    # Steps no probe ran: a big mixed step and a long decode batch.
    for probe in probes(LIMITS)[-3:]:
        seen = serve(probe)
        again = serve(probe, fit.model)
        ttft = [r.token_times_s[0] - r.arrival_s for r in seen]
        assert np.allclose([r.token_times_s[0] - r.arrival_s for r in again], ttft, rtol=0.05)


def test_observations_the_client_saw_wrong_are_left_out_of_the_fit(observed):
    """A token held back in a socket makes one gap long and the next short; a burst's group
    split in two shortens its step. A fit that followed them would be pulled low."""
    glitched = replace(observed, rows=list(observed.rows), seconds=list(observed.seconds),
                       kinds=list(observed.kinds))
    bad = list(range(3, len(glitched.seconds), 25))
    for i in bad:
        glitched.seconds[i] *= 0.3
    fit, kept = fit_observations(glitched)
    assert sorted(np.flatnonzero(~kept)) == bad
    assert fit.model.request_overhead_s == pytest.approx(0.004, rel=0.15)
    assert np.median(fit.held_error) < 0.01
    assert sum(outliers_by_kind(glitched, kept).values()) == len(bad)


KNOTS = (1, 2, 4, 6, 7, 12, 13)
STAIRS = {"decode_sampled_1": 1e-3, "decode_sampled_6": 1.2e-3, "decode_sampled_7": 2.5e-3,
          "decode_sampled_12": 2.6e-3, "decode_sampled_13": 4e-3}


def test_a_server_that_publishes_row_knots_has_its_decode_staircase_fitted():
    """A decode step whose cost jumps at tile edges: probes at every knot and a fit with a
    fixed cost per knot recover it; the same probes fitted as a line miss the jumps."""
    costs = tuple(COSTS.get(n, STAIRS.get(n, 0.0)) for n in feature_names(KNOTS))
    true = CalibratedCostModel(costs, KNOTS, request_overhead_s=0.004)
    limits = replace(LIMITS, row_knots=KNOTS)
    batches = {len(p.requests) for p in probes(limits) if p.kind == "decode"}
    assert set(KNOTS) <= batches
    fits = {}
    for knots in (KNOTS, ()):
        out = Observations(knots)
        for probe in probes(limits):
            observe(probe, serve(probe, true), limits, out)
        for probe in join_probes(limits, median_decode_step(out)):
            observe(probe, serve(probe, true), limits, out)
        fits[knots] = fit_observations(out)[0]
    assert fits[KNOTS].model.row_knots == KNOTS

    def decode_step_error(model, rows: int) -> float:
        plan = _decode_plan([(512, 8)] * rows)
        truth = true.execute(plan).duration_s
        return abs(model.execute(plan).duration_s - truth) / truth

    rows = (3, 6, 7, 10, 12, 13, 24)
    assert max(decode_step_error(fits[KNOTS].model, k) for k in rows) < 0.02
    assert max(decode_step_error(fits[()].model, k) for k in rows) > 0.05


def test_an_incomplete_stream_is_a_clear_error():
    probe = probes(LIMITS)[0]
    seen = serve(probe)
    seen[0].token_times_s.pop()
    with pytest.raises(ValueError, match="must stream every token"):
        observe(probe, seen, LIMITS, Observations())
