"""Prometheus metrics in vLLM's names, on a registry of the server's own (not the global one).

prometheus_client accepts ':' in metric names (the recording-rule convention vLLM uses);
counters get their `_total` suffix from the library, so `vllm:prompt_tokens` is exposed as
`vllm:prompt_tokens_total`. Updated from the engine thread; the client library is thread-safe.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sim.engine.core import FinishReason, Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.speculation.speculator import Speculator

# vLLM's bucket boundaries, in seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CACHE_INFO = "vllm:cache_config_info"  # labels: the KV pool's block size, blocks, caching
KERNEL_INFO = "servelab:kernel_info"  # label row_knots: where a decode step's cost steps


class ServerMetrics:
    """The server's gauges, counters and latency histograms, labelled by model_name."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        reg, label = self.registry, ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, label, registry=reg).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, label, registry=reg).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, label, buckets=buckets, registry=reg).labels(model_name)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache blocks in use, 0 to 1.")
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Arrival to first token, queueing included.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Gap between consecutive tokens of one request.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Arrival to finish of a request.", E2E_BUCKETS)
        self.preemptions = _RunningTotal(
            counter("vllm:num_preemptions", "Preemptions by recompute."))
        self.prefix_cache_queries = _RunningTotal(counter(
            "vllm:prefix_cache_queries",
            "Prefix cache lookups in tokens: every admission queries its whole sequence."))
        self.prefix_cache_hits = _RunningTotal(counter(
            "vllm:prefix_cache_hits", "Tokens of prefix cache lookups found in the cache."))
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        success = Counter("vllm:request_success", "Finished requests by finish reason.",
                          ["model_name", "finished_reason"], registry=reg)
        self._success = {reason: success.labels(model_name, reason.value)
                         for reason in FinishReason}
        self._model_name = model_name
        self._spec: _SpecDecodeCounters | None = None  # describe_speculation: on

    def on_tokens(self, request: Request, first_new: int) -> None:
        """Record tokens first_new.. of a request (its first token also counts the prompt)."""
        times = request.token_times_s
        if first_new == 0:
            self.ttft.observe(times[0] - request.arrival_s)
            self.prompt_tokens.inc(request.prompt_len)
        for i in range(max(first_new, 1), len(times)):
            self.itl.observe(times[i] - times[i - 1])
        self.generation_tokens.inc(len(times) - first_new)

    def on_finish(self, request: Request) -> None:
        """Count a finished request and its end-to-end latency."""
        if request.finish_reason is not None:
            self._success[request.finish_reason].inc()
        if request.finish_s is not None:
            self.e2e.observe(request.finish_s - request.arrival_s)

    def describe_cache(self, config: SchedulerConfig) -> None:
        """`vllm:cache_config_info`, as vLLM publishes it: the KV cache's settings as labels
        of a gauge set to 1 (what `calibrate --url` reads the pool from)."""
        labels = {"block_size": str(config.block_size), "num_gpu_blocks": str(config.num_blocks),
                  "enable_prefix_caching": str(config.enable_prefix_caching)}
        Gauge(CACHE_INFO, "Information of the KV cache configuration.",
              list(labels), registry=self.registry).labels(**labels).set(1)

    def describe_kernels(self, row_knots: tuple[int, ...]) -> None:
        """`servelab:kernel_info`: the row counts where the executor's decode step cost changes
        slope (its GEMM's tiles, executor.native.ROW_KNOTS; empty on the torch path), so that
        `calibrate --url` fits the step cost's staircase instead of a line through it."""
        Gauge(KERNEL_INFO, "Information of the executor's kernels.", ["row_knots"],
              registry=self.registry).labels(",".join(map(str, row_knots))).set(1)

    def describe_speculation(self, num_speculative_tokens: int) -> None:
        """vLLM's spec-decode counters, registered only when speculation is on (as vLLM does)."""
        self._spec = _SpecDecodeCounters(self.registry, self._model_name, num_speculative_tokens)

    def set_state(self, scheduler: Scheduler) -> None:
        """The scheduler's state after a step (engine thread: the scheduler's owner)."""
        self.running.set(len(scheduler.running))
        self.waiting.set(len(scheduler.waiting))
        self.kv_usage.set(scheduler.block_manager.usage)
        self.preemptions.set(scheduler.num_preemptions)
        self.prefix_cache_queries.set(scheduler.prefix_cache_queries)
        self.prefix_cache_hits.set(scheduler.prefix_cache_hits)
        if self._spec is not None and scheduler.speculator is not None:
            self._spec.set(scheduler.speculator)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)


class _RunningTotal:
    """A counter that follows a running total kept elsewhere (the scheduler's).

    Prometheus counters only go up by increments, so each update adds the growth since the
    last one; only the engine thread calls `set`, so `_seen` needs no lock.
    """

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._seen = 0

    def set(self, total: int) -> None:
        if total > self._seen:
            self._counter.inc(total - self._seen)
            self._seen = total


class _SpecDecodeCounters:
    """vllm:spec_decode_* as vLLM names and labels them (vllm/v1/spec_decode/metrics.py), with
    the server's model_name label: verifying rows, proposals, accepted proposals, and accepted
    proposals by position (label position="0".."k-1"). They follow the speculator's totals."""

    def __init__(self, registry: CollectorRegistry, model_name: str, k: int) -> None:
        def counter(name: str, doc: str) -> _RunningTotal:
            return _RunningTotal(Counter(name, doc, ["model_name"],
                                         registry=registry).labels(model_name))

        self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens",
                                    "Number of draft tokens.")
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens",
                                "Number of accepted tokens.")
        per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                          "Accepted tokens per draft position.", ["model_name", "position"],
                          registry=registry)
        self.per_pos = [_RunningTotal(per_pos.labels(model_name, str(i))) for i in range(k)]

    def set(self, speculator: Speculator) -> None:
        self.drafts.set(speculator.num_drafts)
        self.draft_tokens.set(speculator.num_draft_tokens)
        self.accepted.set(speculator.num_accepted_tokens)
        for total, count in zip(self.per_pos, speculator.accepted_per_pos, strict=True):
            total.set(count)
