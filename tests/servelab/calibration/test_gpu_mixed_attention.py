"""The mixed prefill+decode attention term against the profiled mixed kernels it was fitted on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servelab.calibration.gpu_profiles import lss_profile_dirs
from sim.cost.gpu_shapes import known_gpu
from sim.cost.gpu_terms import load_terms

PROFILES = lss_profile_dirs()


@pytest.mark.parametrize("gpu,shapes,tp,folder", PROFILES,
                         ids=[f"{p[0]}-{p[1].name}-tp{p[2]}" for p in PROFILES])
def test_mixed_shots_are_priced_from_their_parts_and_the_fitted_re_reads(gpu, shapes, tp, folder):
    """Chunk alone + decode rows alone x the fitted factor prices every profiled mixed shot of
    8+ decode rows within a median 12% (the two parts alone are 25-55% short)."""
    group = (shapes.num_heads // tp) / max(1, shapes.num_kv_heads // tp)
    terms = load_terms(gpu, known_gpu(gpu))
    frame = pd.read_csv(folder / "attention.csv")
    alone = frame[frame.n_decode == 0].set_index(["prefill_chunk", "kv_prefill"]).time_us
    decode = frame[frame.prefill_chunk == 0].set_index(["n_decode", "kv_decode"]).time_us
    shots = frame[(frame.prefill_chunk > 0) & (frame.n_decode >= 8) & (frame.kv_decode >= 256)]
    with_term, without = [], []
    for r in shots.itertuples(index=False):
        chunk, rows = alone[r.prefill_chunk, r.kv_prefill], decode[r.n_decode, r.kv_decode]
        factor = terms.mixed_decode_factor(r.n_decode, r.kv_decode, group)
        with_term.append(abs((chunk + rows * factor) / r.time_us - 1))
        without.append(abs((chunk + rows) / r.time_us - 1))
    assert np.median(with_term) < 0.12
    assert np.median(without) > 2 * np.median(with_term)


def test_the_factor_needs_grouped_query_heads():
    terms = load_terms("rtx-pro-6000", known_gpu("rtx-pro-6000"))
    assert terms.mixed_decode_factor(64, 1024, 1.0) == 1.0  # MHA: nothing to re-read
    four, eight = (terms.mixed_decode_factor(64, 1024, g) for g in (4.0, 8.0))
    assert 1.0 < four < eight
    # Clamped at the table's edges, linear between its points.
    assert terms.mixed_decode_factor(10**6, 10**9, 4.0) == terms.mixed_decode_factor(
        terms.mixed_rows[-1], terms.mixed_kv[-1], 4.0)
    mid = terms.mixed_decode_factor(48, 1024, 4.0)
    ends = sorted(terms.mixed_decode_factor(r, 1024, 4.0) for r in (32, 64))
    assert ends[0] <= mid <= ends[1]
