"""The fitted GPU cost model: a step's time as the sum of its operators' physical costs.

Each operator (QKV, attention by chunk/context and by decode KV, O-proj, MLP or MoE experts
by tokens per expert, norms/RoPE/activation/add, LM head, sampling) costs the larger of its
FLOPs over peak x eff_compute(rows) and its bytes over bandwidth x eff_memory(rows), with
efficiencies fitted on operator profiles (sim/data/gpu_cost_fit.json); all-reduces and the
expert-parallel exchange by message size and GPUs; and the engine's per-step CPU time as
its own term (sim.engine_overhead). Per-token-count parts are cached, so `predict` is a few
lookups a step.
"""

from __future__ import annotations

from dataclasses import replace

from sim.core import BatchPlan, Request, StepResult
from sim.cost_model import QUANTIZATIONS, check_fp8
from sim.engine_overhead import EngineOverhead, load_engine
from sim.gpu_shapes import GpuPeaks, LayerShapes
from sim.gpu_terms import GpuTerms, load_terms, moe_experts_s
from sim.gpu_terms import gemm_s as _gemm_s
from sim.gpu_terms import small_op_s as _small_op_s
from sim.hardware import HardwareSpec
from sim.model_specs import ModelSpec


class GpuCostModel:
    """A Backend pricing each BatchPlan with the fitted per-operator model."""

    name = "gpu-fitted"

    def __init__(self, shapes: LayerShapes, peaks: GpuPeaks, engine: EngineOverhead,
                 tensor_parallel: int = 1, expert_parallel: int = 1,
                 terms: GpuTerms | None = None, dtype_bytes: int = 2,
                 quantization: str | None = None) -> None:
        if tensor_parallel < 1 or shapes.num_heads % tensor_parallel:
            raise ValueError(f"GpuCostModel: tensor_parallel={tensor_parallel} must divide "
                             f"the {shapes.num_heads} heads of {shapes.name}")
        if expert_parallel < 1 or (expert_parallel > 1 and not shapes.is_moe):
            raise ValueError(f"GpuCostModel: expert_parallel={expert_parallel} needs a MoE "
                             f"model ({shapes.name} is dense)")
        if expert_parallel > 1 and expert_parallel % tensor_parallel:
            raise ValueError(f"GpuCostModel: expert_parallel={expert_parallel} spans tp x dp "
                             f"GPUs; tensor_parallel={tensor_parallel} must divide it")
        self.shapes, self.peaks, self.engine = shapes, peaks, engine
        self.tensor_parallel, self.expert_parallel = tensor_parallel, expert_parallel
        # Expert parallel spans tp x dp GPUs; the tp GPUs of a data-parallel rank share its
        # tokens, so an expert sees the tokens of the dp ranks, not of ep of them.
        self.data_parallel = expert_parallel // tensor_parallel if expert_parallel > 1 else 1
        terms = terms if terms is not None else load_terms(peaks.name, peaks)
        if engine.compute_scale != 1.0:
            scale = engine.compute_scale
            terms = replace(terms,
                            gemm_eff_compute=tuple(e * scale for e in terms.gemm_eff_compute),
                            attn_prefill_eff_compute=terms.attn_prefill_eff_compute * scale)
        self.terms = terms
        self.dtype_bytes = dtype_bytes
        # FP8 quantization (vLLM's --quantization fp8): the linear layers' weights in one
        # byte, their GEMMs on FP8 tensor cores over activations quantized before each (a
        # small op), at the efficiencies fitted for 16-bit GEMMs (both terms scale alike:
        # twice the peak, half the weight bytes). lm_head, router and KV stay 16-bit.
        if quantization not in (None, *QUANTIZATIONS):
            raise ValueError(f"GpuCostModel: quantization {quantization!r}: choose from "
                             f"{', '.join(QUANTIZATIONS)}")
        if quantization:
            check_fp8(peaks.name, peaks.peak_fp8_flops)
        self.quantization = quantization
        self._linear_bytes = 1 if quantization else dtype_bytes
        self._linear_peak = peaks.peak_fp8_flops if quantization else None
        s, tp, t = shapes, tensor_parallel, self.terms
        self._q_dim = s.num_heads // tp * s.head_dim
        kv_heads = max(1, s.num_kv_heads // tp)  # replicated beyond num_kv_heads GPUs
        self._group = (s.num_heads // tp) / kv_heads  # query heads reading each KV head
        self._kv_bytes_layer = 2 * kv_heads * s.head_dim * dtype_bytes  # K+V of one token
        layers = s.num_layers
        self._layers = layers
        # KV swapped to or from host memory (--preemption swap), copied before the forward;
        # each GPU moves its own heads' share over its own link.
        self._swap_s_per_token = layers * self._kv_bytes_layer / peaks.host_link_bytes_s
        self._kernel_s = engine.per_kernel_s
        # Attention, per unit on one GPU in one layer.
        self._s_per_prefill_pair = 4.0 * self._q_dim / (peaks.peak_flops
                                                        * t.attn_prefill_eff_compute)
        self._s_per_decode_kv = self._kv_bytes_layer / (peaks.mem_bandwidth_bytes_s
                                                        * t.attn_decode_eff_memory)
        self._mla = s.kv_lora_rank > 0
        if self._mla:
            self._latent_attention(peaks, dtype_bytes)
        self._prefill_floor_s = t.attn_prefill_floor_s
        self._decode_floor_s = t.attn_decode_floor_s
        self._overlapped = engine.overlapped
        self._host_layer_s = self._kernel_s * self._kernels_per_layer()
        # Parts that depend only on the step's tokens (layer, embedding) or rows (sampling,
        # host time), computed once per count.
        self._token_cache: dict[int, tuple[float, float]] = {}
        self._row_cache: dict[int, tuple[float, float]] = {}

    def _latent_attention(self, peaks: GpuPeaks, dtype_bytes: int) -> None:
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
        self._kv_bytes_layer = latent * dtype_bytes
        self._swap_s_per_token = self._layers * self._kv_bytes_layer / peaks.host_link_bytes_s
        flops_s = peaks.peak_flops * t.attn_prefill_eff_compute
        self._s_per_prefill_pair = 2.0 * heads * (s.head_dim + s.v_head_dim) / flops_s
        read_s = self._kv_bytes_layer / (peaks.mem_bandwidth_bytes_s * t.attn_decode_eff_memory)
        score_s = 2.0 * heads * (latent + s.kv_lora_rank) / flops_s
        self._s_per_decode_kv = read_s if read_s > score_s else score_s

    @property
    def reads_rows(self) -> bool:
        """A step's time comes from the plan's totals alone (sim.deferred may apply)."""
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
        per_tokens = self._token_cache.get(tokens)
        if per_tokens is None:
            per_tokens = self._token_cache[tokens] = (self.layer_s(tokens), self.embed_s(tokens))
        rows = plan.prefill_seqs + decode_seqs
        per_rows = self._row_cache.get(rows)
        if per_rows is None:
            per_rows = self._row_cache[rows] = (self.sample_s(rows), self.host_s(rows))
        layer, host = per_tokens[0], self._host_layer_s
        if plan.prefill_tokens:
            layer += self._prefill_floor_s + self._s_per_prefill_pair * plan.prefill_attn_causal
            host += self._kernel_s
            if self._mla:  # the chunks' cached context, up-projected to K and V to attend
                layer += self._context_s(plan)
        if decode_seqs:
            kv_s = self._s_per_decode_kv * plan.decode_context
            if plan.prefill_tokens:  # one varlen kernel: decode rows lose their GQA sharing
                kv_s *= self.terms.mixed_decode_factor(
                    decode_seqs, plan.decode_context / decode_seqs, self._group)
            layer += self._decode_floor_s + kv_s
            host += self._kernel_s
        # An eager host dispatches a layer's kernels while the GPU runs the previous ones:
        # the slower of the two sets the layer's time.
        gpu_s = self._layers * (layer if layer > host else host) + per_tokens[1] + per_rows[0]
        gpu_s += swap_s
        if self._overlapped:  # the host's step work runs beside the GPU's
            return gpu_s if gpu_s > per_rows[1] else per_rows[1]
        return gpu_s + per_rows[1]

    def decode_steps_s(self, rows: int, context: int, num_steps: int) -> list[float]:
        """What predict gives num_steps decode-only plans of `rows` rows over `context` KV
        tokens at the first and `rows` more at each next (same terms, same order)."""
        if rows < 1:
            raise ValueError(f"decode_steps_s: rows must be >= 1, got {rows}")
        per_tokens = self._token_cache.get(rows)
        if per_tokens is None:
            per_tokens = self._token_cache[rows] = (self.layer_s(rows), self.embed_s(rows))
        per_rows = self._row_cache.get(rows)
        if per_rows is None:
            per_rows = self._row_cache[rows] = (self.sample_s(rows), self.host_s(rows))
        base, embed, (sample, host_s) = per_tokens[0], per_tokens[1], per_rows
        host = self._host_layer_s + self._kernel_s
        floor, per_kv, layers = self._decode_floor_s, self._s_per_decode_kv, self._layers
        overlapped = self._overlapped
        contexts = range(context, context + rows * num_steps, rows)
        if not self._kernel_s and overlapped:  # CUDA graphs, async host: the common case
            return [g if g > host_s else host_s
                    for g in (layers * (base + (floor + per_kv * ctx)) + embed + sample
                              for ctx in contexts)]
        out = []
        for ctx in contexts:
            layer = base + (floor + per_kv * ctx)
            gpu_s = layers * (layer if layer > host else host) + embed + sample
            if overlapped:
                out.append(gpu_s if gpu_s > host_s else host_s)
            else:
                out.append(gpu_s + host_s)
        return out

    def host_s(self, rows: int) -> float:
        """The engine's host time of a step of `rows` sequences."""
        return self.engine.step_s + self.engine.per_row_s * rows

    def _gemm(self, tokens: float, k: int, m: int) -> float:
        return _gemm_s(self.terms, self.peaks, tokens, k, m, self.dtype_bytes)

    def _linear(self, tokens: float, k: int, m: int) -> float:
        """A linear layer's GEMM (quantized with the model, unlike the lm_head and router)."""
        if not self.quantization:
            return self._gemm(tokens, k, m)
        return _gemm_s(self.terms, self.peaks, tokens, k, m, self.dtype_bytes,
                       self._linear_bytes, self._linear_peak) + self._quantize(tokens * k)

    def _quantize(self, elements: float) -> float:
        """Quantizing `elements` activations to FP8 before a GEMM: read 16-bit, write 8."""
        return self._small(elements * (self.dtype_bytes + 1))

    def _small(self, moved_bytes: float) -> float:
        return _small_op_s(self.terms, self.peaks, moved_bytes)

    def _kernels_per_layer(self) -> int:
        """Kernels one layer launches besides attention (what an eager host dispatches)."""
        s, tp = self.shapes, self.tensor_parallel
        count = 2 + 2 + (1 if s.rope else 0) + (1 if s.qk_norm else 0)  # QKV, O, norms
        count += 5 if s.is_moe else 3  # router, top-k, 2 expert GEMMs, act | up, act, down
        if s.shared_expert_intermediate_size:  # its up, act, down (gate, gated add)
            count += 5 if s.shared_expert_gate else 3
        count += 2 if tp > 1 else 0  # the two all-reduces
        if not s.fused_add_norm:  # separate residual adds, and biases added after the
            count += 2 + (2 if tp > 1 else 0)  # row-parallel all-reduces
        return count + (1 if self.data_parallel > 1 else 0)  # the ranks' token exchange

    def layer_s(self, tokens: int) -> float:
        """One layer's GEMMs, small ops and collectives for `tokens` rows (no attention)."""
        s, t, tp, b = self.shapes, self.terms, self.tensor_parallel, self.dtype_bytes
        h, q_dim = s.hidden_size, self._q_dim
        if self._mla:
            layer = self._latent_projections_s(tokens)
            kv_dim = s.qk_rope_head_dim  # (the RoPE below: one shared key per token)
        else:
            kv_dim = self._kv_bytes_layer // (2 * b)
            layer = self._linear(tokens, h, q_dim + 2 * kv_dim) + self._linear(tokens, q_dim, h)
        layer += self.mlp_s(tokens)
        # Two fused add+RMSNorms (or norms and adds), RoPE on q and k, (Qwen3) q/k norms.
        layer += 2 * self._small(4 * tokens * h * b)
        if not s.fused_add_norm:
            layer += 2 * self._small(3 * tokens * h * b)
        if s.rope:
            layer += self._small(2 * tokens * (q_dim + kv_dim) * b)
        if s.qk_norm:
            layer += self._small(2 * tokens * (q_dim + kv_dim) * b)
        # Row-parallel O-proj and down-proj each all-reduce [tokens, hidden].
        return layer + 2 * t.allreduce_s(tokens * h * b, tp)

    def _context_s(self, plan: BatchPlan) -> float:
        """kv_b over the cached context of a step's prefill chunks (vLLM's MLA prefill
        up-projects it before attending to it). The plan holds chunk x KV length summed:
        exact for one chunk a step (as chunked prefill's usually are), else the chunks'
        mean length."""
        context = plan.prefill_attn * plan.prefill_seqs / plan.prefill_tokens - plan.prefill_tokens
        if context < 1:
            return 0.0
        s = self.shapes
        heads = s.num_heads // self.tensor_parallel
        nope = s.head_dim - s.qk_rope_head_dim
        return self._linear(context, s.kv_lora_rank, heads * (nope + s.v_head_dim))

    def _latent_projections_s(self, tokens: float) -> float:
        """MLA's projections for `tokens` rows: q (through its bottleneck and norm, where the
        model has one), the latent and RoPE key (whole on every GPU) and the latent's norm,
        kv_b (a prefill's up-projection of K and V, or decode's absorption of it into the
        queries and outputs: the same weights and FLOPs), and o."""
        s, b, h = self.shapes, self.dtype_bytes, self.shapes.hidden_size
        heads = s.num_heads // self.tensor_parallel
        q_lora, latent = s.q_lora_rank, s.kv_lora_rank
        q_s = (self._linear(tokens, h, q_lora) + self._small(2 * tokens * q_lora * b)
               + self._linear(tokens, q_lora, heads * s.head_dim) if q_lora
               else self._linear(tokens, h, heads * s.head_dim))
        nope = s.head_dim - s.qk_rope_head_dim
        return (q_s + self._linear(tokens, h, latent + s.qk_rope_head_dim)
                + self._small(2 * tokens * latent * b)
                + self._linear(tokens, latent, heads * (nope + s.v_head_dim))
                + self._linear(tokens, heads * s.v_head_dim, h))

    def embed_s(self, tokens: int) -> float:
        """Embedding gather and final norm over `tokens`."""
        h, b = self.shapes.hidden_size, self.dtype_bytes
        return self._small(2 * tokens * h * b) + self._small(4 * tokens * h * b)

    def sample_s(self, rows: int) -> float:
        """LM head over the rows that sample, the logits gather, and the sampler."""
        s, t, tp, b = self.shapes, self.terms, self.tensor_parallel, self.dtype_bytes
        if not rows:
            return 0.0
        head = self._gemm(rows, s.hidden_size, s.vocab_size // tp)
        if tp > 1:  # the vocab-parallel logits gathered: about half an all-reduce's bytes
            head += t.allreduce_s(rows * s.vocab_size // tp * b, tp) / 2
        return head + t.sampler_floor_s + t.sampler_per_row_s * rows + 6 * self._kernel_s

    def mlp_s(self, tokens: int, group_tokens: int | None = None) -> float:
        """One layer's MLP, averaged over the model's layers: dense, or (MoE layers) routed
        experts by tokens per expert and any shared expert; under expert parallelism the
        experts see `group_tokens` from every data-parallel rank (default: every rank has as
        many as this one)."""
        s = self.shapes
        if not s.is_moe:
            return self._dense_mlp_s(tokens, s.intermediate_size // self.tensor_parallel)
        moe = self.moe_mlp_s(tokens, group_tokens)
        dense = s.num_dense_layers
        if not dense:
            return moe
        dense_s = self._dense_mlp_s(tokens, s.intermediate_size // self.tensor_parallel)
        return (s.num_moe_layers * moe + dense * dense_s) / s.num_layers

    def _dense_mlp_s(self, tokens: int, inter: int) -> float:
        """A dense SwiGLU/GELU MLP `inter` wide on this GPU."""
        s, b, h = self.shapes, self.dtype_bytes, self.shapes.hidden_size
        gates = 2 if s.gated_mlp else 1
        return (self._linear(tokens, h, gates * inter) + self._linear(tokens, inter, h)
                + self._small((gates + 1) * tokens * inter * b))

    def moe_mlp_s(self, tokens: int, group_tokens: int | None = None) -> float:
        """One MoE layer's MLP: the routed experts, the router and, where the model has one,
        the shared expert every token passes through (split over tp, as vLLM shards it)."""
        s, t, tp, b = self.shapes, self.terms, self.tensor_parallel, self.dtype_bytes
        h = s.hidden_size
        ep, k, experts = self.expert_parallel, s.experts_per_token, s.num_experts
        # Expert parallel keeps each expert whole on one GPU; otherwise tp splits each.
        inter = s.moe_intermediate_size // (tp if ep == 1 else 1)
        # Every data-parallel rank's tokens reach this GPU's E / ep experts (all-gathered);
        # an expert is active if any of them routes to it (top-k of E, independent rows).
        dp = self.data_parallel
        group = tokens * dp if group_tokens is None else group_tokens
        slots = group * k / ep
        active = experts / ep * (1.0 - (1.0 - k / experts) ** group)
        experts_s = moe_experts_s(t, self.peaks, slots, active, h, inter, b,
                                  self._linear_bytes, self._linear_peak)
        if self.quantization:  # the routed tokens, then their activations, quantized
            experts_s += self._quantize(slots * h) + self._quantize(slots * inter)
        router_s = self._gemm(tokens, h, experts)
        act_s = self._small(3 * slots * inter * b)
        # Data-parallel ranks under expert parallelism: all-gather their tokens, reduce-scatter
        # the outputs (the bytes of one all-reduce of every rank's [tokens, hidden]). Within
        # one rank the tp GPUs already share its tokens: the MLP's all-reduce sums the experts.
        exchange_s = t.allreduce_s(group * h * b, ep) if dp > 1 else 0.0
        out = experts_s + router_s + act_s + exchange_s
        shared = s.shared_expert_intermediate_size
        if shared:  # the rank's own tokens through it, and its one-output gate if any
            out += self._dense_mlp_s(tokens, shared // tp)
            if s.shared_expert_gate:  # the gate's GEMV and the gated add
                out += self._gemm(tokens, h, 1) + self._small(3 * tokens * h * b)
        return out

    def execute(self, plan: BatchPlan) -> StepResult:
        """Backend protocol: the predicted duration, no sampled tokens."""
        return StepResult(duration_s=self.predict(plan))

    def free(self, request: Request) -> None:
        """Backend protocol: the cost model keeps no per-request state."""


def gpu_cost_backend(model: ModelSpec, hardware: HardwareSpec, tensor_parallel: int = 1,
                     engine: str = "vllm", expert_parallel: int = 1,
                     quantization: str | None = None) -> GpuCostModel:
    """The fitted model for a servelab ModelSpec on a HardwareSpec, as vLLM runs it."""
    return GpuCostModel(LayerShapes.from_model_spec(model), GpuPeaks.from_hardware_spec(hardware),
                        load_engine(engine), tensor_parallel=tensor_parallel,
                        expert_parallel=expert_parallel, quantization=quantization)
