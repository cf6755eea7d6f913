"""The simulated backend: wall-clock pacing on a fake clock, sampled rows, a simulated server."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servelab.bench.client import BenchConfig, bench_requests, run_bench
from servelab.serve.engine_thread import EngineThreadConfig
from servelab.serve.server import ServerThread, assemble
from servelab.serve.simulated import (
    SimulatedBackend,
    round_trip_token_ids,
    sampled_token_ids,
    simulate_speculation,
)
from servelab.serve.state import ApiConfig
from servelab.serve.tokenizer import ByteTokenizer
from sim.cost.fixed_backend import ConstantBackend
from sim.cost.roofline import AnalyticCostModel
from sim.engine.core import FinishReason, Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.speculation.config import SpeculativeConfig
from sim.engine.step import Engine
from tests.servelab.serve.helpers import HANG_S
from workloads import open_trace

TOKEN = 123  # any id: a pool of one, so the backend samples it every time
STEP_S, PER_TOKEN_S = 0.010, 0.001


class FakeClock:
    """perf_counter and sleep for the backend: sleeping advances the clock, nothing waits."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now_s += seconds


@dataclass(frozen=True)
class SlowPricing(ConstantBackend):
    """A constant-time cost model that itself takes `spent_s` of the fake clock to price."""

    step_s: float = STEP_S
    per_token_s: float = PER_TOKEN_S
    fake: FakeClock = field(default_factory=FakeClock, compare=False)
    spent_s: float = 0.0

    def execute(self, plan):
        self.fake.now_s += self.spent_s
        return super().execute(plan)


def engine_on(fake: FakeClock, spent_s: float = 0.0, **config) -> Engine:
    scheduler = Scheduler(SchedulerConfig(num_blocks=64, block_size=16, max_model_len=256,
                                          **config))
    pricing = SlowPricing(fake=fake, spent_s=spent_s)
    backend = SimulatedBackend(pricing, (TOKEN,), fake.sleep, fake.clock)
    return Engine(scheduler, backend)


def step(engine: Engine, fake: FakeClock):
    plan = engine.schedule(fake.now_s)
    result = engine.execute(plan)
    engine.finish_step(plan, result, fake.now_s - result.duration_s)
    return plan, result


def test_simulated_step_sleeps_the_predicted_duration():
    fake = FakeClock()
    engine = engine_on(fake)
    engine.add(Request("a", 0.0, 4, 3))
    _, result = step(engine, fake)
    assert fake.slept == [pytest.approx(STEP_S + 4 * PER_TOKEN_S)]
    assert result.duration_s == pytest.approx(STEP_S + 4 * PER_TOKEN_S)


def test_simulated_step_sleeps_only_the_time_left_after_pricing():
    fake = FakeClock()
    engine = engine_on(fake, spent_s=0.004)
    engine.add(Request("a", 0.0, 4, 3))
    _, result = step(engine, fake)
    assert fake.slept == [pytest.approx(STEP_S + 4 * PER_TOKEN_S - 0.004)]
    assert result.duration_s == pytest.approx(STEP_S + 4 * PER_TOKEN_S)


def test_simulated_step_never_sleeps_when_already_late():
    fake = FakeClock()
    engine = engine_on(fake, spent_s=1.0)
    engine.add(Request("a", 0.0, 4, 3))
    _, result = step(engine, fake)
    assert fake.slept == []
    assert result.duration_s == pytest.approx(1.0)


def test_continuing_step_is_timed_from_when_the_previous_one_was_due():
    """The engine's bookkeeping between two steps of running work comes out of the sleep."""
    fake = FakeClock()
    engine = engine_on(fake)
    engine.add(Request("a", 0.0, 4, 3))
    step(engine, fake)
    fake.now_s += 0.003  # the engine thread's own work between the steps
    step(engine, fake)  # a decode of the same request: no idle time came between
    assert fake.slept[1] == pytest.approx(STEP_S + PER_TOKEN_S - 0.003)


def test_continuing_step_credit_is_capped_at_its_own_duration():
    fake = FakeClock()
    engine = engine_on(fake)
    engine.add(Request("a", 0.0, 4, 3))
    step(engine, fake)
    fake.now_s += 1.0  # far behind: this step cannot repay it, nor can the next
    step(engine, fake)
    fake.now_s += 0.002
    step(engine, fake)
    assert fake.slept[1:] == [pytest.approx(STEP_S + PER_TOKEN_S - 0.002)]


def test_first_step_after_idle_sleeps_its_whole_duration():
    fake = FakeClock()
    engine = engine_on(fake)
    engine.add(Request("a", 0.0, 4, 1))
    step(engine, fake)
    assert not engine.scheduler.has_unfinished
    fake.now_s += 5.0  # idle until the next arrival
    engine.add(Request("b", 0.0, 8, 1))
    step(engine, fake)
    assert fake.slept[1] == pytest.approx(STEP_S + 8 * PER_TOKEN_S)


def test_tokens_for_exactly_the_rows_that_complete_their_sequence():
    """Chunked prefill: a chunk short of the prompt's end samples nothing."""
    fake = FakeClock()
    engine = engine_on(fake, policy="chunked", token_budget=16, max_num_seqs=8)
    engine.add(Request("short", 0.0, 4, 3))
    engine.add(Request("long", 0.0, 30, 2))
    sampled_by_step = []
    while engine.scheduler.has_unfinished:
        plan, result = step(engine, fake)
        assert len(result.sampled_token_ids) == plan.num_sampled
        sampled_by_step.append(sorted(result.sampled_token_ids))
    # 4 + 12 of 30; 1 + 15 (27 of 30); 1 + the last 3; then long's second token.
    assert sampled_by_step == [["short"], ["short"], ["long", "short"], ["long"]]


def test_engine_on_simulated_backend_runs_every_request_to_max_tokens():
    fake = FakeClock()
    engine = engine_on(fake, policy="chunked", token_budget=32, max_num_seqs=8)
    requests = [Request(str(i), 0.0, 5 + 7 * i, 2 + i) for i in range(6)]
    for request in requests:
        engine.add(request)
    while engine.scheduler.has_unfinished:
        step(engine, fake)
    for request in requests:
        assert request.finish_reason is FinishReason.LENGTH
        assert request.output_token_ids == [TOKEN] * request.max_new_tokens


def test_padding_rows_sample_nothing():
    fake = FakeClock()
    engine = engine_on(fake, policy="static")
    engine.add(Request("a", 0.0, 4, 1))
    engine.add(Request("b", 0.0, 4, 3))
    step(engine, fake)  # both prefill; a is done and becomes padding
    plan = engine.schedule(fake.now_s)
    assert [r.request_id for r in plan.padding] == ["a"]
    assert sampled_token_ids(plan, (TOKEN,)) == {"b": TOKEN}


def simulated_server(num_blocks: int = 2048, max_model_len: int = 1024,
                     speculative: SpeculativeConfig | None = None) -> ServerThread:
    """A server on a simulated Llama-3-8B on an H200, paced on the real clock."""
    tokenizer = ByteTokenizer()
    config = SchedulerConfig(policy="continuous", num_blocks=num_blocks, block_size=16,
                             max_model_len=max_model_len, speculative=speculative)
    scheduler = Scheduler(config)
    backend = SimulatedBackend(AnalyticCostModel.preset("llama-3-8b", "h200"),
                               round_trip_token_ids(tokenizer),
                               acceptance=simulate_speculation(scheduler))
    api = ApiConfig("llama-3-8b", max_model_len)
    state = assemble(scheduler, backend, tokenizer, tokenizer.vocab_size, api,
                     EngineThreadConfig())
    return ServerThread(state)


def test_simulated_server_completes_a_replayed_trace():
    trace = open_trace("synthetic:n=20,rate=40,prompt=uniform(16,200),output=uniform(2,24)")
    with simulated_server() as server:
        requests = bench_requests(trace, ByteTokenizer().vocab_size)
        result = asyncio.run(run_bench(requests, BenchConfig(server.url, timeout_s=60)))
        models = httpx.get(f"{server.url}/v1/models", trust_env=False, timeout=HANG_S).json()
        body = {"model": "llama-3-8b", "prompt": "hi", "max_tokens": 4}
        plain = httpx.post(f"{server.url}/v1/completions", json=body, trust_env=False,
                           timeout=HANG_S).json()
        metrics = httpx.get(f"{server.url}/metrics", trust_env=False, timeout=HANG_S)
    assert result.errors == []
    for record, sent in zip(result.requests, requests, strict=True):
        assert record.finish_reason is FinishReason.LENGTH
        assert len(record.token_times_s) == sent.max_tokens
    assert [card["id"] for card in models["data"]] == ["llama-3-8b"]
    text = plain["choices"][0]["text"]
    assert len(ByteTokenizer().encode(text)) == plain["usage"]["completion_tokens"] == 4
    assert metrics.status_code == 200 and "vllm:request_success_total" in metrics.text


def stream_chunks(url: str, path: str, body: dict) -> list[dict]:
    """The JSON chunks of a streamed answer ([DONE] checked and dropped)."""
    events = httpx.post(f"{url}{path}", json={**body, "stream": True}, trust_env=False,
                        timeout=HANG_S).text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    return [json.loads(event.removeprefix("data: ")) for event in events[:-2]]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
])
def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(path, body):
    body = {**body, "max_tokens": 6, "seed": 3,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with simulated_server() as server:
        chunks = stream_chunks(server.url, path, body)
        plain = stream_chunks(server.url, path, {**body, "stream_options": None})
    assert all("usage" in chunk for chunk in chunks)  # as vLLM, which GuideLLM reads
    counts = [chunk["usage"]["completion_tokens"] for chunk in chunks]
    assert counts == sorted(counts) and counts[-1] == 6
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 6
    assert "usage" not in plain[0]  # without stream_options only the finish chunk has it


def spec_counters(url: str) -> dict[str, float]:
    """The vllm:spec_decode_* samples of /metrics, per position where labelled."""
    text = httpx.get(f"{url}/metrics", trust_env=False, timeout=HANG_S).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:spec_decode") and sample.name.endswith("_total"):
                assert sample.labels["model_name"] == "llama-3-8b"
                position = sample.labels.get("position")
                out[sample.name + ("" if position is None else f"/{position}")] = sample.value
    return out


def test_speculative_simulated_server_exports_vllms_spec_decode_counters():
    """Rates 1, 1, 0, 0: every verifying row accepts exactly its first two proposals. A
    10-token request: the prefill's token, then rows of k = 4, 4, 2 (the last cut to what is
    left) gaining 3 tokens each: 3 drafts, 10 proposals, 6 accepted, at positions 0 and 1."""
    spec = SpeculativeConfig.from_json('{"method": "ngram", "num_speculative_tokens": 4, '
                                       '"acceptance_rates": [1.0, 1.0, 0.0, 0.0]}')
    body = {"model": "llama-3-8b", "prompt": "the cat sat on the mat", "max_tokens": 10,
            "seed": 5, "return_token_ids": True}
    with simulated_server(speculative=spec) as server:
        assert spec_counters(server.url)["vllm:spec_decode_num_drafts_total"] == 0
        answers = [httpx.post(f"{server.url}/v1/completions", json=body, trust_env=False,
                              timeout=HANG_S).json() for _ in range(3)]
        counters = spec_counters(server.url)
    with simulated_server() as server:
        plain = httpx.post(f"{server.url}/v1/completions", json=body, trust_env=False,
                           timeout=HANG_S).json()
        assert spec_counters(server.url) == {}  # off: not exported, as vLLM leaves them out
    assert counters == {
        "vllm:spec_decode_num_drafts_total": 9,
        "vllm:spec_decode_num_draft_tokens_total": 30,
        "vllm:spec_decode_num_accepted_tokens_total": 18,
        "vllm:spec_decode_num_accepted_tokens_per_pos_total/0": 9,
        "vllm:spec_decode_num_accepted_tokens_per_pos_total/1": 9,
        "vllm:spec_decode_num_accepted_tokens_per_pos_total/2": 0,
        "vllm:spec_decode_num_accepted_tokens_per_pos_total/3": 0,
    }
    # Speculation moves when tokens arrive, not which: the text is the plain server's.
    for answer in answers:
        assert answer["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
        assert answer["usage"]["completion_tokens"] == 10
