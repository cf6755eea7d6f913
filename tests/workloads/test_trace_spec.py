"""The synthetic spec string: what it parses to, and errors that name the bad key and value."""

from __future__ import annotations

import numpy as np
import pytest

from workloads import (
    Empirical,
    Fixed,
    LogNormal,
    Pareto,
    SpecError,
    Uniform,
    load_bundled,
    open_trace,
    parse_spec,
)


def test_full_spec_parses() -> None:
    spec = parse_spec(
        "synthetic:n=2000,rate=4,arrival=gamma,cv=3,prompt=lognormal(1024,0.8),output=pareto(50,1.5)"
    )
    assert (spec.num_requests, spec.rate_per_s, spec.arrival, spec.cv) == (2000, 4.0, "gamma", 3.0)
    assert spec.prompt == LogNormal(1024.0, 0.8)
    assert spec.output == Pareto(50.0, 1.5)


def test_defaults_and_spaces() -> None:
    spec = parse_spec("synthetic: n = 10 , rate=0.5, prompt = uniform(1, 9)")
    assert spec.arrival == "poisson" and spec.cv == 1.0
    assert spec.prompt == Uniform(1, 9) and spec.output == Fixed(128)


def test_empirical_sources_are_opened_once() -> None:
    opened = []

    def resolve(name: str):
        opened.append(name)
        return load_bundled(name)

    spec = parse_spec(
        "synthetic:n=3,rate=1,prompt=empirical(azure-code),output=empirical(azure-code)",
        resolve=resolve,
    )
    assert opened == ["azure-code"]
    assert isinstance(spec.prompt, Empirical) and spec.prompt.trace is spec.output.trace


def test_open_trace_uses_the_seed() -> None:
    text = "synthetic:n=50,rate=2,prompt=lognormal(100,1)"
    a, b, c = open_trace(text, seed=1), open_trace(text, seed=1), open_trace(text, seed=2)
    assert a.name == text and len(a) == 50
    np.testing.assert_array_equal(a.prompt_len, b.prompt_len)
    assert not np.array_equal(a.prompt_len, c.prompt_len)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("synth:n=1,rate=1", "must start with 'synthetic:'"),
        ("synthetic:rate=1", "missing n="),
        ("synthetic:n=5", "missing rate="),
        ("synthetic:n=5,rate=1,burst=2", "unknown key 'burst'"),
        ("synthetic:n=5,rate=1,n=6", "key 'n' given twice"),
        ("synthetic:n=5,rate=1,prompt", "item 'prompt' is not KEY=VALUE"),
        ("synthetic:n=five,rate=1", "n='five' is not an integer"),
        ("synthetic:n=2.5,rate=1", "n='2.5' is not an integer"),
        ("synthetic:n=5,rate=fast", "rate='fast' is not a number"),
        ("synthetic:n=5,rate=inf", "rate='inf' is not finite"),
        ("synthetic:n=0,rate=1", "n must be >= 1, got 0"),
        ("synthetic:n=5,rate=-1", "rate must be > 0"),
        ("synthetic:n=5,rate=1,arrival=burst", "arrival='burst'"),
        ("synthetic:n=5,rate=1,arrival=gamma", "arrival=gamma needs cv="),
        ("synthetic:n=5,rate=1,cv=2", "cv= applies only to arrival=gamma"),
        ("synthetic:n=5,rate=1,arrival=gamma,cv=0", "cv must be > 0"),
        ("synthetic:n=5,rate=1,prompt=zipf(2)", "prompt='zipf(2)': unknown distribution 'zipf'"),
        ("synthetic:n=5,rate=1,prompt=512", "prompt='512' is not DIST(ARGS)"),
        ("synthetic:n=5,rate=1,output=lognormal(5)", "output='lognormal(5)': lognormal takes 2"),
        ("synthetic:n=5,rate=1,output=fixed(1.5)", "output=fixed(T)='1.5' is not an integer"),
        ("synthetic:n=5,rate=1,output=pareto(10,x)", "output=pareto(ALPHA)='x' is not a number"),
        ("synthetic:n=5,rate=1,output=pareto(10,-1)", "output='pareto(10,-1)': need min >= 1"),
        ("synthetic:n=5,rate=1,output=fixed(2", "unbalanced parentheses"),
        ("synthetic:n=5,rate=1,output=empirical(a,b)", "empirical takes one trace"),
    ],
)
def test_bad_specs_name_the_key_and_value(text: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(text)
    message = str(caught.value)
    assert message.startswith("synthetic spec: ") and words in message, message


def test_empirical_source_must_exist() -> None:
    with pytest.raises(FileNotFoundError, match="no-such.csv"):
        open_trace("synthetic:n=5,rate=1,prompt=empirical(no-such.csv)")
