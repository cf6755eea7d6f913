"""Prefix caching over HTTP: usage.prompt_tokens_details.cached_tokens and the vLLM counters."""

from __future__ import annotations

import httpx

from tests.servelab.serve.helpers import (
    BLOCK_SIZE,
    async_client,
    run,
    start_server,
    stream_completion,
)
from tests.servelab.serve.test_serve_metrics import samples

PROMPT_LEN = 200
# The cache serves whole blocks and leaves the prompt's last token to compute: 192 of 200.
CACHED = (PROMPT_LEN - 1) // BLOCK_SIZE * BLOCK_SIZE
QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"


def prompt_of(first: int) -> list[int]:
    """A 200-token prompt whose first token sets it apart from the other tests' prompts."""
    return [first] + [3 + (j * 7) % 250 for j in range(PROMPT_LEN - 1)]


def complete(url: str, prompt: list[int]) -> dict:
    """The usage of a non-streamed greedy completion.

    Several output tokens: the scheduler's counters are published after the step that
    admitted the request, so by the time its last token arrives /metrics includes them.
    """
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/completions", json=body, trust_env=False, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def cached_tokens(usage: dict) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


def test_repeated_prompt_reports_cached_tokens_and_counts_hits(server):
    before = samples(server.url)
    first = complete(server.url, prompt_of(10))
    second = complete(server.url, prompt_of(10))
    after = samples(server.url)
    assert cached_tokens(first) == 0 and cached_tokens(second) == CACHED
    assert first["prompt_tokens"] == second["prompt_tokens"] == PROMPT_LEN
    assert after[QUERIES] - before[QUERIES] == 2 * PROMPT_LEN
    assert after[HITS] - before[HITS] == CACHED


def test_streamed_last_chunk_reports_cached_tokens(server):
    body = {"prompt": prompt_of(11), "max_tokens": 4, "temperature": 0.0, "ignore_eos": True}

    async def twice():
        async with async_client(server.url) as client:
            return [await stream_completion(client, body) for _ in range(2)]

    (_, first), (_, second) = run(twice())
    assert cached_tokens(first["usage"]) == 0
    assert cached_tokens(second["usage"]) == CACHED
    assert second["usage"]["prompt_tokens"] == PROMPT_LEN


def test_prefix_caching_off_reports_no_cached_tokens_and_no_hits(tiny_model):
    with start_server(tiny_model, enable_prefix_caching=False) as server:
        usages = [complete(server.url, prompt_of(12)) for _ in range(2)]
        after = samples(server.url)
    assert [cached_tokens(u) for u in usages] == [0, 0]
    assert after[HITS] == 0 and after[QUERIES] == 0  # vLLM counts no lookups it never makes
