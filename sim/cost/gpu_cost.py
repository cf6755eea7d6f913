"""The fitted GPU cost model: a step's time as the sum of its operators' physical costs.

A step runs every layer's operators (sim.cost.gpu_layer: projections, MLP or MoE experts, norms,
RoPE, all-reduces) over its tokens, attention by prefill chunk and context and by decode KV
(each the larger of FLOPs over peak x eff_compute and bytes over bandwidth x eff_memory,
fitted on operator profiles, sim/cost/data/gpu_cost_fit.json), the embedding, LM head and sampler
over its rows, and the engine's per-step CPU time as its own term (sim.cost.engine_overhead),
beside the GPU's or after it. Per-token-count parts are cached, so `predict` is a few lookups
a step.
"""

from __future__ import annotations

from dataclasses import replace

from sim.cost.engine_overhead import EngineOverhead, load_engine
from sim.cost.gpu_layer import LayerCost
from sim.cost.gpu_shapes import GpuPeaks, LayerShapes
from sim.cost.gpu_terms import GpuTerms, load_terms
from sim.cost.roofline import check_kv_cache_dtype
from sim.engine.core import BatchPlan, Request, StepResult
from sim.specs.hardware import HardwareSpec
from sim.specs.model_specs import ModelSpec


class GpuCostModel(LayerCost):
    """A Backend pricing each BatchPlan with the fitted per-operator model: its layers'
    operators (LayerCost), attention by chunk and context, the engine's host time."""

    name = "gpu-fitted"

    def __init__(self, shapes: LayerShapes, peaks: GpuPeaks, engine: EngineOverhead,
                 tensor_parallel: int = 1, expert_parallel: int = 1,
                 terms: GpuTerms | None = None, dtype_bytes: int = 2,
                 quantization: str | None = None, kv_cache_dtype: str = "auto") -> None:
        terms = terms if terms is not None else load_terms(peaks.name, peaks)
        if engine.compute_scale != 1.0:
            scale = engine.compute_scale
            terms = replace(terms,
                            gemm_eff_compute=tuple(e * scale for e in terms.gemm_eff_compute),
                            attn_prefill_eff_compute=terms.attn_prefill_eff_compute * scale)
        super().__init__(shapes, peaks, terms, tensor_parallel, expert_parallel, dtype_bytes,
                         quantization, engine.per_kernel_s)
        s, t = shapes, terms
        # The KV cache's element bytes (--kv-cache-dtype): what decode attention reads and
        # a swap moves; the fitted efficiencies are the 16-bit kernels' (extrapolated).
        check_kv_cache_dtype(kv_cache_dtype, peaks.name, peaks.peak_fp8_flops)
        self.kv_cache_dtype = kv_cache_dtype
        kv_bytes = dtype_bytes if kv_cache_dtype == "auto" else 1
        self._group = (s.num_heads // tensor_parallel) / self._kv_heads  # queries a KV head
        self._kv_bytes_layer = 2 * self._kv_dim * kv_bytes  # K+V of one token
        layers = s.num_layers
        self._layers = layers
        # KV swapped to or from host memory (--preemption swap), copied before the forward;
        # each GPU moves its own heads' share over its own link.
        self._swap_s_per_token = layers * self._kv_bytes_layer / peaks.host_link_bytes_s
        # Attention, per unit on one GPU in one layer.
        self._s_per_prefill_pair = 4.0 * self._q_dim / (peaks.peak_flops
                                                        * t.attn_prefill_eff_compute)
        self._s_per_decode_kv = self._kv_bytes_layer / (peaks.mem_bandwidth_bytes_s
                                                        * t.attn_decode_eff_memory)
        self._mla = s.kv_lora_rank > 0
        if self._mla:
            self._latent_attention(peaks, kv_bytes)
        # Sliding-window layers (gpt-oss): their share of the layers, and the window. The
        # KV pool (and a swap) holds the full-attention layers' K and V a token
        # (sim.specs.model_specs.ModelSpec.kv_bytes_per_token).
        self._window = s.sliding_window
        self._window_share = s.num_sliding_layers / layers
        if self._window:
            self._swap_s_per_token *= 1.0 - self._window_share
        self._prefill_floor_s = t.attn_prefill_floor_s
        self._decode_floor_s = t.attn_decode_floor_s
        self._host_layer_s = self._kernel_s * self.kernels_per_layer()
        self.use_engine(engine)
        # Parts that depend only on the step's tokens (layer, embedding), computed once per
        # count.
        self._token_cache: dict[int, tuple[float, float]] = {}

    def use_engine(self, engine: EngineOverhead) -> None:
        """Price steps and requests with `engine`'s host and front-end terms (its kernel
        dispatch and compute scale are the ones the model was built with)."""
        if hasattr(self, "engine") and (engine.per_kernel_s, engine.compute_scale) != (
                self.engine.per_kernel_s, self.engine.compute_scale):
            raise ValueError(f"engine {engine.name}: per_kernel_s and compute_scale are set "
                             "when the model is built")
        self.engine = engine
        self._overlapped = engine.overlapped
        # SchedulesAhead: an async host plans step n+1 while the GPU runs step n.
        self.schedules_ahead = engine.overlapped
        self.request_overhead_s = engine.request_s  # HasRequestOverhead: TTFT, once
        # Rows' sampling and host time by row count (cleared: the host terms changed).
        self._row_cache: dict[int, tuple[float, float]] = {}

    def _latent_attention(self, peaks: GpuPeaks, kv_bytes: int) -> None:
        """Multi-head latent attention as vLLM runs it. Every GPU caches each token's latent
        and RoPE key whole, once for all its heads. A prefill runs ordinary attention over
        K and V up-projected per head (queries and keys of head_dim, values of v_head_dim).
        Decode rows run the latent kernel: each query, absorbed into the latent, scores
        latent + RoPE key and sums latents, reading a token's latent once for all heads
        (bytes or FLOPs, the larger). Its decode and prefill rows run separate kernels, so
        decode rows beside a chunk lose nothing."""
        s, t, tp = self.shapes, self.terms, self.tensor_parallel
        heads, latent = s.num_heads // tp, s.kv_lora_rank + s.qk_rope_head_dim
        self._group = 1.0
        self._kv_bytes_layer = latent * kv_bytes
        self._swap_s_per_token = self._layers * self._kv_bytes_layer / peaks.host_link_bytes_s
        flops_s = peaks.peak_flops * t.attn_prefill_eff_compute
        self._s_per_prefill_pair = 2.0 * heads * (s.head_dim + s.v_head_dim) / flops_s
        read_s = self._kv_bytes_layer / (peaks.mem_bandwidth_bytes_s * t.attn_decode_eff_memory)
        score_s = 2.0 * heads * (latent + s.kv_lora_rank) / flops_s
        self._s_per_decode_kv = read_s if read_s > score_s else score_s

    @property
    def reads_rows(self) -> bool:
        """A step's time comes from the plan's totals alone (sim.engine.fast_forward may apply)."""
        return False

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel

    def predict(self, plan: BatchPlan) -> float:
        """Seconds one engine step of `plan` takes; 0 for a plan that computes and copies
        nothing."""
        decode_seqs = plan.decode_seqs
        tokens = plan.prefill_tokens + decode_seqs
        swap_s = self._swap_s_per_token * plan.swap_tokens if plan.swap_tokens else 0.0
        if not tokens:
            return swap_s
        rows = plan.prefill_seqs + decode_seqs
        per_tokens, per_rows = self._per_counts(tokens, rows)
        if plan.num_spec_tokens:  # a verifying row's logits at each of its k + 1 positions
            per_rows = (self.sample_s(rows + sum(plan.num_spec_tokens.values())), per_rows[1])
        layer, host = self._with_attention(plan, per_tokens[0], self._host_layer_s)
        if not self.engine.full_graph(plan.prefill_tokens, decode_seqs):
            host += self.engine.piecewise_layer_s  # piecewise graphs: eager launches
        # An eager host dispatches a layer's kernels while the GPU runs the previous ones:
        # the slower of the two sets the layer's time.
        gpu_s = self._layers * (layer if layer > host else host) + per_tokens[1] + per_rows[0]
        gpu_s += swap_s
        if self._overlapped:  # the host's step work runs beside the GPU's
            return gpu_s if gpu_s > per_rows[1] else per_rows[1]
        return gpu_s + per_rows[1]

    def _per_counts(self, tokens: int, rows: int) -> tuple[tuple[float, float],
                                                          tuple[float, float]]:
        """(layer, embedding) seconds for `tokens` tokens and (sampling, host) seconds for
        `rows` rows, each computed once per count."""
        per_tokens = self._token_cache.get(tokens)
        if per_tokens is None:
            per_tokens = self._token_cache[tokens] = (self.layer_s(tokens), self.embed_s(tokens))
        per_rows = self._row_cache.get(rows)
        if per_rows is None:
            per_rows = self._row_cache[rows] = (self.sample_s(rows), self.host_s(rows))
        return per_tokens, per_rows

    def _with_attention(self, plan: BatchPlan, layer: float,
                        host: float) -> tuple[float, float]:
        """A layer's GPU time and host dispatch time with the step's attention kernels added
        (the measured-kernel model overrides this alone)."""
        decode_seqs = plan.decode_seqs
        pairs, context = plan.prefill_attn_causal, plan.decode_context
        if self._window:  # the layers' mean over full and sliding-window attention
            pairs, context = self.windowed_mean(plan)
        if plan.prefill_tokens:
            layer += self._prefill_floor_s + self._s_per_prefill_pair * pairs
            host += self._kernel_s
            if self._mla:  # the chunks' cached context, up-projected to K and V to attend
                layer += self.context_s(plan)
        if decode_seqs:
            kv_s = self._s_per_decode_kv * context
            if plan.prefill_tokens:  # one varlen kernel: decode rows lose their GQA sharing
                kv_s *= self.terms.mixed_decode_factor(
                    decode_seqs, plan.decode_context / decode_seqs, self._group)
            layer += self._decode_floor_s + kv_s
            host += self._kernel_s
        return layer, host

    def windowed_mean(self, plan: BatchPlan) -> tuple[float, float]:
        """The plan's causal prefill pairs and decode KV tokens averaged over the layers, a
        sliding-window layer's bounded by the window from the plan's totals: min(pairs,
        prefill tokens x window), min(sum of contexts, rows x window). Exact when every
        row's context reaches past the window; an upper bound below it."""
        share, window = self._window_share, self._window
        pairs, context = plan.prefill_attn_causal, plan.decode_context
        return ((1.0 - share) * pairs + share * min(pairs, plan.prefill_tokens * window),
                (1.0 - share) * context + share * min(context, plan.decode_seqs * window))

    def decode_steps_s(self, rows: int, context: int, num_steps: int) -> list[float]:
        """What predict gives num_steps decode-only plans of `rows` rows over `context` KV
        tokens at the first and `rows` more at each next (same terms, same order)."""
        if rows < 1:
            raise ValueError(f"decode_steps_s: rows must be >= 1, got {rows}")
        (base, embed), (sample, host_s) = self._per_counts(rows, rows)
        host = self._host_layer_s + self._kernel_s
        if not self.engine.full_graph(0, rows):
            host += self.engine.piecewise_layer_s
        layers, overlapped = self._layers, self._overlapped
        attention = self._decode_attention_s(rows,
                                             range(context, context + rows * num_steps, rows))
        if host == 0.0 and overlapped:  # full CUDA graphs, async host: the common case
            return [g if g > host_s else host_s
                    for g in (layers * (base + att) + embed + sample for att in attention)]
        out = []
        for att in attention:
            layer = base + att
            gpu_s = layers * (layer if layer > host else host) + embed + sample
            if overlapped:
                out.append(gpu_s if gpu_s > host_s else host_s)
            else:
                out.append(gpu_s + host_s)
        return out

    def _decode_attention_s(self, rows: int, contexts: range) -> list[float]:
        """One layer's decode attention of `rows` rows at each total KV context (the
        measured-kernel model overrides this alone)."""
        floor, per_kv = self._decode_floor_s, self._s_per_decode_kv
        if self._window:  # the layers' mean KV read, as windowed_mean gives predict
            share, bound = self._window_share, rows * self._window
            return [floor + per_kv * ((1.0 - share) * ctx + share * (ctx if ctx < bound
                                                                        else bound))
                    for ctx in contexts]
        return [floor + per_kv * ctx for ctx in contexts]

    def host_s(self, rows: int) -> float:
        """The engine's host time of a step of `rows` sequences."""
        return self.engine.step_s + self.engine.per_row_s * rows

    def execute(self, plan: BatchPlan) -> StepResult:
        """Backend protocol: the predicted duration, no sampled tokens."""
        return StepResult(duration_s=self.predict(plan))

    def free(self, request: Request) -> None:
        """Backend protocol: the cost model keeps no per-request state."""


def gpu_cost_backend(model: ModelSpec, hardware: HardwareSpec, tensor_parallel: int = 1,
                     engine: str = "vllm", expert_parallel: int = 1,
                     quantization: str | None = None,
                     kv_cache_dtype: str = "auto") -> GpuCostModel:
    """The fitted model for a servelab ModelSpec on a HardwareSpec, as vLLM runs it."""
    return GpuCostModel(LayerShapes.from_model_spec(model), hardware,
                        load_engine(engine), tensor_parallel=tensor_parallel,
                        expert_parallel=expert_parallel, quantization=quantization,
                        kv_cache_dtype=kv_cache_dtype)
