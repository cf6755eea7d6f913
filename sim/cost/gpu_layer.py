"""One transformer layer's operators on one GPU, and the step's two ends, priced by the fit.

Each operator costs the larger of its FLOPs over peak x eff_compute(rows) and its bytes over
bandwidth x eff_memory(rows) (sim.cost.gpu_terms, fitted on operator profiles): the projections
(DeepSeek's latent ones included), the dense MLP or the MoE layer (routed experts by tokens
per expert, router, shared expert, the data-parallel ranks' exchange), norms, RoPE and
residual adds, the row-parallel all-reduces; the embedding, LM head and sampler. Linear
layers are quantized with the model (FP8), the LM head and router are not; MXFP4 experts
(gpt-oss) read 4.25-bit weights into 16-bit GEMMs. Attention, the
engine's host time and how a step adds these up are sim.cost.gpu_cost's.
"""

from __future__ import annotations

from sim.cost.gpu_shapes import GpuPeaks, LayerShapes
from sim.cost.gpu_terms import GpuTerms, across_nodes_s, moe_experts_s
from sim.cost.gpu_terms import gemm_s as _gemm_s
from sim.cost.gpu_terms import small_op_s as _small_op_s
from sim.cost.roofline import check_quantization
from sim.engine.core import BatchPlan
from sim.specs.model_specs import EXPERT_WEIGHT_BYTES


class LayerCost:
    """The operators of a model's layers as `tensor_parallel` x `expert_parallel` GPUs run
    them, one GPU's share; kernel_s is the host's launch time of a kernel (eager engines)."""

    def __init__(self, shapes: LayerShapes, peaks: GpuPeaks, terms: GpuTerms,
                 tensor_parallel: int = 1, expert_parallel: int = 1, dtype_bytes: int = 2,
                 quantization: str | None = None, kernel_s: float = 0.0) -> None:
        name = type(self).__name__
        if tensor_parallel < 1 or shapes.num_heads % tensor_parallel:
            raise ValueError(f"{name}: tensor_parallel={tensor_parallel} must divide "
                             f"the {shapes.num_heads} heads of {shapes.name}")
        if expert_parallel < 1 or (expert_parallel > 1 and not shapes.is_moe):
            raise ValueError(f"{name}: expert_parallel={expert_parallel} needs a MoE "
                             f"model ({shapes.name} is dense)")
        if expert_parallel > 1 and expert_parallel % tensor_parallel:
            raise ValueError(f"{name}: expert_parallel={expert_parallel} spans tp x dp "
                             f"GPUs; tensor_parallel={tensor_parallel} must divide it")
        # FP8 quantization (vLLM's --quantization fp8): the linear layers' weights in one
        # byte, their GEMMs on FP8 tensor cores over activations quantized before each (a
        # small op), at the efficiencies fitted for 16-bit GEMMs (both terms scale alike:
        # twice the peak, half the weight bytes). lm_head and router stay 16-bit; KV follows
        # --kv-cache-dtype (GpuCostModel).
        check_quantization(name, quantization, peaks.name, peaks.peak_fp8_flops)
        self.shapes, self.peaks, self.terms = shapes, peaks, terms
        self.tensor_parallel, self.expert_parallel = tensor_parallel, expert_parallel
        # Expert parallel spans tp x dp GPUs; the tp GPUs of a data-parallel rank share its
        # tokens, so an expert sees the tokens of the dp ranks, not of ep of them.
        self.data_parallel = expert_parallel // tensor_parallel if expert_parallel > 1 else 1
        self.dtype_bytes, self.quantization = dtype_bytes, quantization
        self._linear_bytes = 1 if quantization else dtype_bytes
        self._linear_peak = peaks.peak_fp8_flops if quantization else None
        # Experts in a format of their own (MXFP4) run weight-only, as vLLM runs them on
        # Hopper: their packed weights read, widened in the kernel, 16-bit GEMMs.
        self._expert_bytes = EXPERT_WEIGHT_BYTES.get(shapes.expert_quantization or "",
                                                     self._linear_bytes)
        self._expert_peak = None if shapes.expert_quantization else self._linear_peak
        self._kernel_s = kernel_s
        self._q_dim = shapes.num_heads // tensor_parallel * shapes.head_dim
        # K and V heads on this GPU (replicated beyond num_kv_heads GPUs).
        self._kv_heads = max(1, shapes.num_kv_heads // tensor_parallel)
        self._kv_dim = self._kv_heads * shapes.head_dim

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

    def kernels_per_layer(self) -> int:
        """Kernels one layer launches besides attention (what an eager host dispatches)."""
        s, tp = self.shapes, self.tensor_parallel
        count = 2 + 2 + (1 if s.rope else 0) + (1 if s.qk_norm else 0)  # QKV, O, norms
        count += 5 if s.is_moe else 3  # router, top-k, 2 expert GEMMs, act | up, act, down
        if s.shared_expert_intermediate_size:  # its up, act, down (gate, gated add)
            count += 5 if s.shared_expert_gate else 3
        count += 2 if tp > 1 else 0  # the two all-reduces
        count += 1 if tp > 1 and s.qk_norm_across_heads else 0  # the q/k norms' sums
        if not s.fused_add_norm:  # separate residual adds, and biases added after the
            count += 2 + (2 if tp > 1 else 0)  # row-parallel all-reduces
        return count + (1 if self.data_parallel > 1 else 0)  # the ranks' token exchange

    def layer_s(self, tokens: int) -> float:
        """One layer's GEMMs, small ops and collectives for `tokens` rows (no attention)."""
        s, t, tp, b = self.shapes, self.terms, self.tensor_parallel, self.dtype_bytes
        h, q_dim = s.hidden_size, self._q_dim
        if s.kv_lora_rank:
            layer = self._latent_projections_s(tokens)
            kv_dim = s.qk_rope_head_dim  # (the RoPE below: one shared key per token)
        else:
            kv_dim = self._kv_dim
            layer = self._linear(tokens, h, q_dim + 2 * kv_dim) + self._linear(tokens, q_dim, h)
        layer += self.mlp_s(tokens)
        layer = self.plus_norms_rope_s(layer, tokens, kv_dim)
        # Row-parallel O-proj and down-proj each all-reduce [tokens, hidden].
        return layer + 2 * t.allreduce_s(tokens * h * b, tp)

    def plus_norms_rope_s(self, out: float, tokens: int, kv_dim: int) -> float:
        """`out` plus a layer's two fused add+RMSNorms (or norms and adds), RoPE on q and k
        over `kv_dim`-wide keys, and (Qwen3) the q/k norms (added in this order)."""
        s, b, h, q_dim = self.shapes, self.dtype_bytes, self.shapes.hidden_size, self._q_dim
        out += 2 * self._small(4 * tokens * h * b)
        if not s.fused_add_norm:
            out += 2 * self._small(3 * tokens * h * b)
        if s.rope:
            out += self._small(2 * tokens * (q_dim + kv_dim) * b)
        if s.qk_norm:
            out += self._small(2 * tokens * (q_dim + kv_dim) * b)
        if s.qk_norm_across_heads and self.tensor_parallel > 1:  # q's and k's fp32 sums
            out += self.terms.allreduce_s(2 * tokens * 4, self.tensor_parallel)
        return out

    def context_s(self, plan: BatchPlan) -> float:
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
                                  self._expert_bytes, self._expert_peak)
        if self.quantization:  # the routed tokens, then their activations, quantized
            experts_s += self._quantize(slots * h) + self._quantize(slots * inter)
        router_s = self._gemm(tokens, h, experts)
        act_s = self._small(3 * slots * inter * b)
        # Data-parallel ranks under expert parallelism: all-gather their tokens, reduce-scatter
        # the outputs (the bytes of one all-reduce of every rank's [tokens, hidden]). Within
        # one rank the tp GPUs already share its tokens: the MLP's all-reduce sums the experts.
        # Over more GPUs than a node holds, the node's all-reduce plus the hop between nodes.
        exchange_s = 0.0
        if dp > 1:
            message = group * h * b
            exchange_s = (t.allreduce_s(message, min(ep, self.peaks.max_gpus))
                          + across_nodes_s(self.peaks, message, ep))
        out = experts_s + router_s + act_s + exchange_s
        shared = s.shared_expert_intermediate_size
        if shared:  # the rank's own tokens through it, and its one-output gate if any
            out += self._dense_mlp_s(tokens, shared // tp)
            if s.shared_expert_gate:  # the gate's GEMV and the gated add
                out += self._gemm(tokens, h, 1) + self._small(3 * tokens * h * b)
        return out
