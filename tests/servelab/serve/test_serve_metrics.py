"""/metrics: Prometheus text that parses, in vLLM's names, agreeing with what was served."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.speculation.config import SpeculativeConfig
from tests.servelab.serve.helpers import (
    BLOCK_SIZE,
    HANG_S,
    MAX_MODEL_LEN,
    health,
    offline_outputs,
    start_server,
)

NAMES = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket", "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
)


def samples(url: str) -> dict[str, float]:
    """Sample name -> value, summed over labels except finished_reason (name/reason)."""
    response = httpx.get(f"{url}/metrics", trust_env=False, timeout=HANG_S)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out.setdefault(sample.name, 0.0)
            if "le" in sample.labels:
                continue
            key = sample.name
            if "finished_reason" in sample.labels:
                key += f"/{sample.labels['finished_reason']}"
            out[key] = out.get(key, 0.0) + sample.value
    return out


def test_metrics_parse_and_count_served_requests(server):
    before = samples(server.url)
    for name in NAMES:
        assert name in before, name
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 5, "ignore_eos": True, "temperature": 0.0}
    for _ in range(3):
        response = httpx.post(f"{server.url}/v1/completions", json=body, trust_env=False,
                              timeout=HANG_S)
        assert response.status_code == 200
    after = samples(server.url)

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    assert delta("vllm:prompt_tokens_total") == 12
    assert delta("vllm:generation_tokens_total") == 15
    assert delta("vllm:request_success_total/length") == 3
    assert delta("vllm:time_to_first_token_seconds_count") == 3
    assert delta("vllm:inter_token_latency_seconds_count") == 12
    assert delta("vllm:e2e_request_latency_seconds_count") == 3
    # Each admission queries its 4 tokens; a prompt shorter than a block is never cached.
    assert delta("vllm:prefix_cache_queries_total") == 12
    assert delta("vllm:prefix_cache_hits_total") == 0
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    assert health(server.url)["kv_blocks_used"] == 0


def test_models_lists_the_served_model(server):
    data = httpx.get(f"{server.url}/v1/models", trust_env=False, timeout=HANG_S).json()
    assert data["object"] == "list"
    (card,) = data["data"]
    assert card["id"] == "tiny" and card["object"] == "model"
    assert card["max_model_len"] == 256 and card["vocab_size"] == 320


def test_executor_server_counts_spec_decode_and_keeps_greedy_outputs(tiny_model):
    """n-gram on the real model: the counters agree with each other and the greedy outputs
    are those of plain decoding offline."""
    spec = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1,
                             prompt_lookup_max=3)
    bodies = [{"prompt": [5, 6, 7, 5, 6, 7, 5 + i], "max_tokens": 24, "ignore_eos": True,
               "temperature": 0.0, "seed": i, "return_token_ids": True} for i in range(3)]
    with start_server(tiny_model, speculative=spec) as server:
        outputs = [httpx.post(f"{server.url}/v1/completions", json=body, trust_env=False,
                              timeout=HANG_S).json()["choices"][0]["token_ids"]
                   for body in bodies]
        after = samples(server.url)
    plain = SchedulerConfig(policy="continuous", num_blocks=1024, block_size=BLOCK_SIZE,
                            max_model_len=MAX_MODEL_LEN)
    assert outputs == offline_outputs(tiny_model, bodies, plain)
    drafts = after["vllm:spec_decode_num_drafts_total"]
    proposed = after["vllm:spec_decode_num_draft_tokens_total"]
    accepted = after["vllm:spec_decode_num_accepted_tokens_total"]
    # (samples sums the per-position counter over its position labels)
    assert after["vllm:spec_decode_num_accepted_tokens_per_pos_total"] == accepted
    assert 0 < drafts <= proposed <= 3 * drafts and 0 < accepted <= proposed
    assert after["vllm:generation_tokens_total"] == 3 * 24
