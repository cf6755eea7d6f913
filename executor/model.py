"""A Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU) over a flat ragged batch of tokens.

Plain nn.Modules in the style of gpt-fast. The forward takes all tokens of a step as one
[P, dim] tensor (T real rows, then padding rows that only the linear layers see) and
returns logits only for the rows that sample (StepInputs.logit_rows).
Norms, RoPE and the MLP follow Hugging Face's Llama/Qwen2 modules op for op, so checkpoints
give HF's logits (attention agrees to ~1e-7, see tests/executor/test_hf_parity.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from executor.attention import paged_attention
from executor.batch import StepInputs
from executor.config import ModelArgs, RopeScaling
from executor.kv_cache import KVCache, write_kv
from executor.linear import Linear

INIT_STD = 0.02  # HF's initializer_range


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 as HF does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.native = False  # servelab's row ops (Transformer.use_row_ops)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x) [T, dim]; given the residual stream, (norm(residual + x), residual + x)."""
        ops = torch.ops.servelab
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps) if self.native else self._norm(x)
        if self.native:
            return ops.add_rms_norm(x, residual, self.weight, self.eps)
        residual = residual + x
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # HF's h * rsqrt(mean(h^2) + eps) op for op (F.rms_norm gives the same bits but took
        # ~4x longer on the decode steps' small row counts)
        h = x.float()
        inv = torch.mean(h * h, dim=-1, keepdim=True).add_(self.eps).rsqrt_()
        return self.weight * (h * inv).to(x.dtype)


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Rotary inverse frequencies [head_dim / 2] in float32, with HF's scaling rules."""
    dim = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return _scale_inv_freq(inv, args.rope_scaling)


def _scale_inv_freq(inv: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    if s.rope_type == "linear":
        return inv / s.factor
    if s.rope_type != "llama3":
        return inv
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, D] by cos/sin [T, D/2] (HF's rotate_half convention)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.mul(x1, c, out=out[..., :half]).addcmul_(x2, s, value=-1.0)  # x1 c - x2 s
    torch.mul(x2, c, out=out[..., half:]).addcmul_(x1, s)  # x2 c + x1 s
    return out


class Attention(nn.Module):
    """GQA self-attention with fused q/k/v projection and paged KV."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        q_dim, kv_dim = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
        self.qk_dim = q_dim + kv_dim
        self.wqkv = Linear(args.dim, q_dim + 2 * kv_dim, bias=args.qkv_bias)
        self.wo = Linear(q_dim, args.dim)
        self.scale = args.head_dim ** -0.5
        self.window = args.sliding_window or 0  # 0: every earlier key is visible
        self.native = False  # servelab's row ops (Transformer.use_row_ops)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                inputs: StepInputs, cache: torch.Tensor) -> torch.Tensor:
        p, t, h, d = x.shape[0], inputs.num_tokens, self.n_heads, self.head_dim
        qkv = self.wqkv(x)  # [P, (H + 2 Hkv) * D]; rows past T are padding
        if self.native:  # rotate q and k, store k and v: one call
            q = torch.ops.servelab.rope_write_kv(qkv, cos, sin, cache, inputs.slots, t, h)
        else:
            qk = apply_rope(qkv[:, :self.qk_dim].view(p, h + self.n_kv_heads, d), cos, sin)
            v = qkv[:, self.qk_dim:].view(p, self.n_kv_heads, d)  # [P, Hkv, D]
            write_kv(cache, qk[:t, h:], v[:t], inputs.slots)
            q = qk[:, :h]
        if inputs.tables is not None:  # the native kernel reads the block tables itself
            out = torch.ops.servelab.paged_attention(
                q, cache, inputs.tables, inputs.row_seq, inputs.positions, t, self.scale,
                self.window)
        else:
            out = paged_attention(q, cache, inputs.groups, self.scale, t)  # [P, H*D]
        return self.wo(out)


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up fused in one matmul."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.hidden = args.intermediate_size
        self.w_gate_up = Linear(args.dim, 2 * args.intermediate_size)
        self.w_down = Linear(args.intermediate_size, args.dim)
        self.native = False  # servelab's row ops (Transformer.use_row_ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.w_gate_up(x)  # [T, 2 I]
        if self.native:
            return self.w_down(torch.ops.servelab.silu_mul(gate_up))
        gate, up = gate_up.split(self.hidden, dim=-1)  # [T, I] x2
        return self.w_down(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    """Pre-norm attention and feed-forward, each with a residual."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.rms_norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.rms_norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, inputs: StepInputs,
                cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(this block's output, the residual stream before it is added): the next norm
        adds them, so the add and the norm are one native op."""
        if residual is None:  # the first block: x is the embedding, the stream so far
            h, residual = self.attention_norm(x), x
        else:
            h, residual = self.attention_norm(x, residual)
        h = self.attention(h, cos, sin, inputs, cache)
        h, residual = self.ffn_norm(h, residual)
        return self.feed_forward(h), residual


class Transformer(nn.Module):
    """Embeddings, decoder blocks, final norm and lm_head (optionally tied)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Parameter(torch.empty(args.vocab_size, args.dim),
                                           requires_grad=False)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.rms_norm_eps)
        self.output = Linear(args.dim, args.vocab_size)
        self.tie_weights()
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin [max_pos, D/2]
        self.native = False  # set by pack_weights: steps use build_step_inputs(paged=True)

    def tie_weights(self) -> None:
        """Share the embedding matrix with lm_head when the model ties them."""
        if self.args.tie_word_embeddings:
            self.output.weight = self.tok_embeddings

    def rope_tables(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos and sin for every position, [max_pos, head_dim / 2], built once per device."""
        if self._rope is None or self._rope[0].device != device or self._rope[0].dtype != dtype:
            inv = rope_inv_freq(self.args)
            freqs = torch.outer(torch.arange(self.args.max_position_embeddings).float(), inv)
            self._rope = (freqs.cos().to(device, dtype), freqs.sin().to(device, dtype))
        return self._rope

    def forward(self, inputs: StepInputs, kv: KVCache) -> torch.Tensor:
        """Logits [S, vocab] in float32 for inputs.logit_rows; writes this step's KV."""
        x = F.embedding(inputs.token_ids, self.tok_embeddings)  # [P, dim]
        cos, sin = self.rope_tables(x.device, x.dtype)
        cos, sin = cos[inputs.positions], sin[inputs.positions]  # [P, D/2]
        residual = None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, cos, sin, inputs, kv.layer(i))
        if inputs.logit_rows.numel() == 0:  # only mid-prompt chunks: nothing samples
            return x.new_empty(0, self.args.vocab_size, dtype=torch.float32)
        rows = inputs.logit_rows
        x, _ = self.norm(x.index_select(0, rows), residual.index_select(0, rows))  # [S, dim]
        return self.output(x).float()  # [S, vocab]

    def linears(self) -> list[Linear]:
        return [m for m in self.modules() if isinstance(m, Linear)]

    def pack_weights(self) -> None:
        """Prepack every linear for the batch-invariant CPU path (after loading weights)."""
        for linear in self.linears():
            linear.pack()
        # Native attention and row ops go with native linears: CPU float32, the kernels built.
        self.native = self.output.is_native and self.args.head_dim % 8 == 0
        self.use_row_ops(self.native)

    def use_row_ops(self, on: bool) -> None:
        """Run RMSNorm, SiLU-and-multiply and RoPE with the KV write as servelab's native ops
        (a native model only) or as torch ops (benchmarks/speed/row_ops.py compares the two)."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, FeedForward)):
                module.native = on and self.native


def init_weights(model: Transformer, seed: int) -> None:
    """HF-style random init from one generator: normal(0, 0.02), zero biases, unit norms."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        elif name.endswith("bias"):
            param.data.zero_()
        else:
            values = torch.empty(param.shape).normal_(0.0, INIT_STD, generator=generator)
            param.data.copy_(values)
    model.pack_weights()
