"""Synthetic arrivals and lengths: asked-for rates, CVs and distribution parameters come back."""

from __future__ import annotations

import numpy as np
import pytest

from workloads import (
    Empirical,
    Fixed,
    LogNormal,
    Pareto,
    SyntheticSpec,
    Trace,
    Uniform,
    gamma_arrivals_s,
    generate_trace,
    poisson_arrivals_s,
    summarize,
)

N = 20_000


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_poisson_rate_and_cv_within_5_percent() -> None:
    arrival_s = poisson_arrivals_s(N, 4.0, rng())
    assert arrival_s[0] == 0.0 and (np.diff(arrival_s) >= 0).all()
    gaps = np.diff(arrival_s)
    assert (N - 1) / arrival_s[-1] == pytest.approx(4.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_rate_and_cv_within_5_percent(cv: float) -> None:
    arrival_s = gamma_arrivals_s(N, 10.0, cv, rng(1))
    gaps = np.diff(arrival_s)
    assert (N - 1) / arrival_s[-1] == pytest.approx(10.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_lognormal_parameters_round_trip() -> None:
    lengths = LogNormal(1024, 0.8).sample(N, rng(2))
    logs = np.log(lengths)
    assert np.exp(logs.mean()) == pytest.approx(1024, rel=0.03)
    assert logs.std() == pytest.approx(0.8, rel=0.03)
    assert lengths.dtype == np.int64 and lengths.min() >= 1


def test_pareto_parameters_round_trip() -> None:
    lengths = Pareto(100, 1.5).sample(N, rng(3))
    min_tokens = lengths.min()
    alpha = len(lengths) / np.log(lengths / min_tokens).sum()  # maximum likelihood
    assert min_tokens == 100
    assert alpha == pytest.approx(1.5, rel=0.05)


def test_uniform_covers_both_ends_and_fixed_is_constant() -> None:
    lengths = Uniform(3, 6).sample(N, rng())
    assert set(lengths.tolist()) == {3, 4, 5, 6}
    assert (Fixed(7).sample(10, rng()) == 7).all()


def test_lengths_are_at_least_one() -> None:
    assert LogNormal(1, 3.0).sample(N, rng()).min() == 1


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Fixed(0), ">= 1"),
        (lambda: Uniform(5, 4), "low <= high"),
        (lambda: LogNormal(0.5, 1), "median >= 1"),
        (lambda: Pareto(10, 0), "alpha > 0"),
    ],
)
def test_bad_distribution_parameters_raise(make, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        make()


def test_empirical_resamples_source_values_and_pairs(conv_trace: Trace) -> None:
    prompt = Empirical(conv_trace, "prompt_len")
    alone = prompt.sample(1000, rng())
    assert set(alone.tolist()) <= set(conv_trace.prompt_len.tolist())
    spec = SyntheticSpec(1000, 2.0, prompt, Empirical(conv_trace, "output_len"))
    trace = generate_trace(spec, rng())
    pairs = set(zip(conv_trace.prompt_len.tolist(), conv_trace.output_len.tolist(), strict=True))
    drawn = zip(trace.prompt_len.tolist(), trace.output_len.tolist(), strict=True)
    assert all(pair in pairs for pair in drawn)  # whole rows: the correlation is kept


def test_same_seed_same_trace_and_different_seed_differs() -> None:
    spec = SyntheticSpec(500, 3.0, LogNormal(200, 1.0), Pareto(20, 2.0), "gamma", 2.0)
    first, again, other = (generate_trace(spec, rng(s)) for s in (7, 7, 8))
    assert first.table.equals(again.table)
    assert not first.table.equals(other.table)


def test_generated_trace_summary_matches_spec() -> None:
    spec = SyntheticSpec(N, 5.0, Fixed(100), Fixed(10), "gamma", 2.0)
    summary = summarize(generate_trace(spec, rng(4), name="g"))
    assert summary.requests == N and summary.name == "g"
    assert summary.rate_per_s == pytest.approx(5.0, rel=0.05)
    assert summary.interarrival_cv == pytest.approx(2.0, rel=0.05)
    assert summary.prompt_len_p99 == 100 and summary.output_len_mean == 10
