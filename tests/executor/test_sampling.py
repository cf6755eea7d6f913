"""Sampling: seeded draws are reproducible, depend only on (seed, token index), and the
top-k / top-p / temperature limits behave as their definitions say."""

from __future__ import annotations

import math

import torch

from executor.sampling import GREEDY_BELOW_TEMPERATURE, Sampler, sample_row, token_seed
from sim.engine.core import Request, SamplingParams


def request(request_id: str, seed: int = 0, outputs: int = 0, **params) -> Request:
    r = Request(request_id, 0.0, 4, 100, prompt_token_ids=[5, 6, 7, 8],
                sampling=SamplingParams(seed=seed, **params))
    r.output_token_ids = [9] * outputs
    r.token_times_s = [0.0] * outputs
    return r


def random_logits(rows: int, vocab: int = 320, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_seeded_sampling_is_reproducible_across_samplers():
    logits = random_logits(1)
    draws = [Sampler().sample(logits, [request("a", seed=7, temperature=1.0)]) for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]


def test_draw_depends_on_seed_and_output_index_only():
    logits = random_logits(1, vocab=32000)
    by_seed = {Sampler().sample(logits, [request("a", seed=s, temperature=1.0)])[0]
               for s in range(20)}
    by_index = {Sampler().sample(logits, [request("a", outputs=i, temperature=1.0)])[0]
                for i in range(20)}
    assert len(by_seed) > 10 and len(by_index) > 10
    # The same (seed, index) gives the same token whatever was drawn before (recompute-safe).
    sampler = Sampler()
    first = sampler.sample(logits, [request("a", outputs=5, temperature=1.0)])
    sampler.sample(logits, [request("a", outputs=6, temperature=1.0)])
    assert sampler.sample(logits, [request("a", outputs=5, temperature=1.0)]) == first


def test_rows_do_not_share_random_streams():
    logits = random_logits(3)
    a = request("a", seed=1, temperature=1.0, top_p=0.9)
    alone = Sampler().sample(logits[:1], [a])
    together = Sampler().sample(logits, [a, request("b", seed=2, temperature=0.7),
                                         request("c", seed=1, temperature=1.0)])
    reordered = Sampler().sample(logits[[1, 0]], [request("b", seed=2, temperature=0.7), a])
    assert together[0] == alone[0] == reordered[1]
    assert together[1] == reordered[0]


def test_top_k_one_and_tiny_top_p_equal_greedy():
    logits = random_logits(50, seed=3)
    logits[7, :10] = logits[7].max() + 1  # ties for the maximum: the lowest id wins
    greedy = logits.argmax(dim=-1).tolist()
    sampler = Sampler()
    top_k = sampler.sample(logits, [request(f"k{i}", seed=i, temperature=1.5, top_k=1)
                                    for i in range(50)])
    top_p = sampler.sample(logits, [request(f"p{i}", seed=i, temperature=1.5, top_p=1e-6)
                                    for i in range(50)])
    plain = sampler.sample(logits, [request(f"g{i}") for i in range(50)])
    assert top_k == top_p == plain == greedy
    assert greedy[7] == 0


def test_temperature_below_greedy_threshold_is_greedy():
    # 1e-39 and 5e-324 overflowed logits / temperature to inf: every draw was NaN's last id.
    logits = random_logits(8, seed=4)
    greedy = logits.argmax(dim=-1).tolist()
    assert greedy != [logits.shape[1] - 1] * 8
    sampler = Sampler()
    for temperature in (5e-324, 1e-39, 1e-30, 1e-6, GREEDY_BELOW_TEMPERATURE * 0.999):
        rows = [request(f"t{i}", seed=i, temperature=temperature, top_p=0.5, top_k=40)
                for i in range(8)]
        assert sampler.sample(logits, rows) == greedy, temperature
    # From the threshold on it is a draw: a flat distribution gives many different tokens.
    flat = torch.zeros(4, 320)
    drawn = sampler.sample(flat, [request(f"f{i}", seed=i, temperature=GREEDY_BELOW_TEMPERATURE)
                                  for i in range(4)])
    assert drawn != [0, 0, 0, 0]


def draws(logits: torch.Tensor, count: int, **params) -> list[int]:
    params = SamplingParams(**params)
    generator = torch.Generator()
    return [sample_row(logits, params, generator.manual_seed(token_seed(0, i)))
            for i in range(count)]


def test_temperature_sampling_follows_the_softmax():
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0])
    tokens = draws(logits, 4000, temperature=1.0)
    expected = torch.softmax(logits, dim=-1).tolist()
    for token, p in enumerate(expected):
        freq = tokens.count(token) / len(tokens)
        assert abs(freq - p) < 4 * math.sqrt(p * (1 - p) / len(tokens)) + 1e-3, token


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert set(draws(logits, 500, temperature=1.0, top_k=2)) == {0, 1}
    # top_p=0.7: token 1 is kept (0.5 before it), token 2 is not (0.8 before it).
    assert set(draws(logits, 500, temperature=1.0, top_p=0.7)) == {0, 1}
    assert set(draws(logits, 2000, temperature=1.0)) == {0, 1, 2, 3}


def test_token_seeds_are_distinct_and_free_forgets_the_generator():
    seeds = {token_seed(s, i) for s in range(50) for i in range(50)}
    assert len(seeds) == 2500 and all(0 <= s < 2**63 for s in seeds)
    sampler = Sampler()
    sampler.sample(random_logits(1), [request("a", temperature=1.0)])
    assert "a" in sampler._generators
    sampler.free("a")
    assert "a" not in sampler._generators


def test_allowed_token_ids_limit_greedy_and_random_draws():
    allowed = [5, 9, 17]
    sampler = Sampler(allowed_token_ids=allowed)
    rows = [request(f"r{i}", seed=i, outputs=k, temperature=t)
            for i, t in enumerate((0.0, 1.0, 1.0, 0.0)) for k in range(5)]
    assert set(sampler.sample(random_logits(len(rows)), rows)) <= set(allowed)
