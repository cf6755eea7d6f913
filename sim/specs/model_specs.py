"""Transformer shapes as plain data, shared by the cost models (sim) and the executor.

Presets here are the small shapes tests and the executor use; real models are Hugging Face
configs (sim.specs.model_config reads them, sim/specs/models/ ships the common ones).
"""

from __future__ import annotations

from dataclasses import dataclass

# Activations of a gated MLP (gate, up and down projections: three matrices); any other
# activation is a plain two-matrix MLP.
GATED_ACTIVATIONS = ("silu", "swiglu", "gelu_pytorch_tanh_gated")
# Expert quantizations a checkpoint may carry apart from its other linear layers, and the
# bytes one expert weight takes in each. MXFP4 (OCP microscaling): 4-bit values in blocks of
# 32 sharing one 8-bit scale, 4 + 8 / 32 = 4.25 bits a weight.
EXPERT_WEIGHT_BYTES: dict[str, float] = {
    "mxfp4": 4.25 / 8,  # 4-bit values, one 8-bit scale a 32 (gpt-oss)
    "int4": 4.5 / 8,  # 4-bit integers, one 16-bit scale a group of 32 (W4A16: Kimi-K2)
}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder's shape, dense or mixture-of-experts; enough to size weights, KV and FLOPs.

    Field names follow Hugging Face's config.json where one exists.
    """

    name: str
    hidden_size: int
    intermediate_size: int  # the dense MLP's width (layers without experts)
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    max_position_embeddings: int
    # A query head's width: usually hidden_size // num_heads (default_head_dim); Qwen3 sets
    # it apart from hidden_size.
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 adds biases to q/k/v projections
    hidden_act: str = "silu"
    qk_norm: bool = False  # Qwen3 normalises each head's q and k (head_dim weights each)
    # Mixture of experts (0 experts: a dense model). Each MoE layer routes every token to
    # num_experts_per_tok of num_experts experts of width moe_intermediate_size, plus an
    # always-on shared expert of width shared_expert_intermediate_size (0: none).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0  # layers of an MoE model that keep a dense MLP
    # Qwen2-MoE scales its shared expert by a one-output gate; Llama 4 adds it as it is.
    shared_expert_gate: bool = True
    # Llama 4: attention local to chunks of this many tokens in its RoPE layers (0: none).
    # Priced as full attention: exact while a sequence fits one chunk, above it beyond.
    attention_chunk_size: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3; 0: none): K and V live in the KV cache as
    # one latent of kv_lora_rank plus a shared RoPE key of qk_rope_head_dim per token and
    # layer, up-projected per head by kv_b; head_dim is a query's (no-RoPE part + RoPE
    # part), v_head_dim a value's; q goes through a q_lora_rank bottleneck where set.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # A checkpoint's own weight quantization (its config's quantization_config): "fp8", or
    # None for weights in the serving dtype. --quantization sets it for any checkpoint.
    quantization: str | None = None
    # A checkpoint's own KV cache scheme, as vLLM's --kv-cache-dtype auto resolves it (one
    # of sim.cost.roofline.KV_CACHE_DTYPES, e.g. fp8_e4m3), or None: the serving dtype.
    kv_cache_dtype: str | None = None
    # Routed experts' own weight format where it differs from the other linear layers'
    # (gpt-oss: "mxfp4", Kimi-K2: "int4", one of EXPERT_WEIGHT_BYTES); None: as the other
    # linear layers.
    expert_quantization: str | None = None
    # FP8 weights scaled per block of this many x this many (a checkpoint's
    # weight_block_size: MiniMax-M2, DeepSeek-V3); 0: per-tensor scales.
    weight_block_size: int = 0
    # Sliding-window attention (gpt-oss; 0: none): num_sliding_layers of the layers attend
    # to the last sliding_window positions only (their own included), the others to all.
    sliding_window: int = 0
    num_sliding_layers: int = 0
    # gpt-oss: a learned logit per head in each softmax's denominator ("attention sinks"):
    # num_heads weights a layer and one more score a row (negligible FLOPs and bytes).
    attention_sinks: bool = False
    # gpt-oss: biases on the o projection, the router and every expert's projections.
    o_bias: bool = False
    expert_bias: bool = False
    # MiniMax-M2: q and k each normalised over all heads at once (q and k dims of weights),
    # not per head as Qwen3 does (qk_norm is set too: the same norm kernel's bytes).
    qk_norm_across_heads: bool = False

    def __post_init__(self) -> None:
        for key in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                    "num_kv_heads", "vocab_size", "max_position_embeddings"):
            if getattr(self, key) < 1:
                raise ValueError(f"model {self.name}: {key} must be >= 1")
        if self.head_dim < 1:
            raise ValueError(f"model {self.name}: head_dim must be >= 1, got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model {self.name}: num_heads not divisible by num_kv_heads")
        self._check_experts()
        self._check_window()

    def _check_window(self) -> None:
        if self.expert_quantization not in (None, *EXPERT_WEIGHT_BYTES):
            raise ValueError(f"model {self.name}: expert_quantization "
                             f"{self.expert_quantization!r}: choose from "
                             f"{', '.join(EXPERT_WEIGHT_BYTES)}")
        if self.sliding_window < 0 or not 0 <= self.num_sliding_layers < self.num_layers:
            raise ValueError(f"model {self.name}: sliding_window must be >= 0 and "
                             f"num_sliding_layers in [0, num_layers={self.num_layers})")
        if bool(self.sliding_window) != bool(self.num_sliding_layers):
            raise ValueError(f"model {self.name}: sliding_window and num_sliding_layers are "
                             "set together")

    def _check_experts(self) -> None:
        if self.num_experts == 0:
            if self.num_experts_per_tok or self.moe_intermediate_size or self.num_dense_layers:
                raise ValueError(f"model {self.name}: expert fields without num_experts")
            return
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"model {self.name}: num_experts_per_tok must be in "
                             f"[1, num_experts={self.num_experts}]")
        if self.moe_intermediate_size < 1:
            raise ValueError(f"model {self.name}: moe_intermediate_size must be >= 1")
        if not 0 <= self.num_dense_layers < self.num_layers:
            raise ValueError(f"model {self.name}: num_dense_layers must be in "
                             f"[0, num_layers={self.num_layers})")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def _attention_weights(self) -> int:
        """One layer's attention projection weights (no biases, no norms)."""
        h, d, heads = self.hidden_size, self.head_dim, self.num_heads
        if not self.is_mla:
            return 2 * h * heads * d + 2 * h * self.num_kv_heads * d
        q_lora = self.q_lora_rank
        q = h * q_lora + q_lora * heads * d if q_lora else h * heads * d
        nope = d - self.qk_rope_head_dim
        kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim)
              + self.kv_lora_rank * heads * (nope + self.v_head_dim))
        return q + kv + heads * self.v_head_dim * h

    @property
    def num_full_attention_layers(self) -> int:
        """Layers attending to the whole context (all but the sliding-window ones)."""
        return self.num_layers - self.num_sliding_layers

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP (or one expert): 3 gated, else 2."""
        return 3 if self.hidden_act in GATED_ACTIVATIONS else 2

    @property
    def attention_params(self) -> int:
        """One layer's attention weights: q, k, v, o (and q/k biases and norms if any)."""
        d = self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        bias = (q + 2 * kv if self.qkv_bias else 0) + (self.hidden_size if self.o_bias else 0)
        norms = 2 * self.head_dim if self.qk_norm else 0
        if self.qk_norm_across_heads:
            norms = q + kv
        if self.attention_sinks:
            norms += self.num_heads
        if self.is_mla:  # the q and kv bottlenecks' norms
            norms = self.q_lora_rank + self.kv_lora_rank
        return self._attention_weights + bias + norms

    @property
    def expert_params(self) -> int:
        """One routed expert's weights (and biases: gate/up outputs and down's, gpt-oss)."""
        h, inter = self.hidden_size, self.moe_intermediate_size
        bias = (self.mlp_matrices - 1) * inter + h if self.expert_bias else 0
        return self.mlp_matrices * h * inter + bias

    @property
    def moe_dense_params(self) -> int:
        """One MoE layer's weights every token uses: the router and the shared expert."""
        shared = self.mlp_matrices * self.hidden_size * self.shared_expert_intermediate_size
        shared_gate = (self.hidden_size if self.shared_expert_intermediate_size
                       and self.shared_expert_gate else 0)
        router = self.num_experts * (self.hidden_size + (1 if self.expert_bias else 0))
        return router + shared + shared_gate

    @property
    def expert_params_total(self) -> int:
        """Every routed expert of every MoE layer."""
        return self.num_moe_layers * self.num_experts * self.expert_params

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings and lm_head counted once if tied)."""
        h = self.hidden_size
        dense_mlp = self.mlp_matrices * h * self.intermediate_size
        num_dense = self.num_layers - self.num_moe_layers
        layers = (self.num_layers * (self.attention_params + 2 * h) + num_dense * dense_mlp
                  + self.num_moe_layers * self.moe_dense_params + self.expert_params_total)
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return layers + embed + h

    @property
    def quantizable_params(self) -> int:
        """The linear layers' weights, which FP8 quantization stores in one byte each (vLLM's
        --quantization fp8): q/k/v/o, dense MLPs, shared and routed experts. Embeddings,
        the lm_head, norms, biases and routers keep the model's dtype."""
        h = self.hidden_size
        num_dense = self.num_layers - self.num_moe_layers
        shared = self.mlp_matrices * h * self.shared_expert_intermediate_size
        return (self.num_layers * self._attention_weights
                + num_dense * self.mlp_matrices * h * self.intermediate_size
                + self.num_moe_layers * shared + self.expert_params_total)

    def expert_weight_bytes(self, linear_bytes: float) -> float:
        """Bytes of one routed expert weight: its own format's (EXPERT_WEIGHT_BYTES), else
        the linear layers' `linear_bytes`."""
        if self.expert_quantization is None:
            return linear_bytes
        return EXPERT_WEIGHT_BYTES[self.expert_quantization]

    def weight_bytes(self, dtype_bytes: int, linear_bytes: int) -> int:
        """All weights' bytes, the linear layers' at `linear_bytes` a weight and the routed
        experts' at expert_weight_bytes."""
        linear = self.quantizable_params - self.expert_params_total
        experts = self.expert_params_total * self.expert_weight_bytes(linear_bytes)
        return int((self.num_params - linear - self.expert_params_total) * dtype_bytes
                   + linear * linear_bytes + experts)

    @property
    def num_active_params(self) -> int:
        """Parameters one token's forward uses: all but the experts it is not routed to."""
        idle = self.num_moe_layers * (self.num_experts - self.num_experts_per_tok)
        return self.num_params - idle * self.expert_params

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V one token occupies in the KV pool across its layers (MLA: the
        latent and the RoPE key, which every tensor-parallel GPU holds whole). Sliding-window
        layers are not counted: vLLM's hybrid KV cache manager pages the full-attention and
        the sliding layers as groups of equally many layers from one pool (gpt-oss: 18 and
        18), so a token of context costs the full-attention layers' bytes, and each
        sequence's window (at most sliding_window tokens of window_kv_bytes_per_token) comes
        on top of it."""
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes
        layers = self.num_full_attention_layers
        return 2 * layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def window_kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V one token occupies in the sliding-window layers (0: none)."""
        return 2 * self.num_sliding_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def default_head_dim(name: str, hidden_size: int, num_heads: int) -> int:
    """hidden_size // num_heads, the head width of a config that names none (0 when num_heads
    is not positive: the spec's own checks name that)."""
    if num_heads < 1:
        return 0
    if hidden_size % num_heads:
        raise ValueError(f"model {name}: hidden_size not divisible by num_heads")
    return hidden_size // num_heads


MODEL_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # Fast CPU tests; vocab covers the byte-level tokenizer (256 bytes + specials).
        ModelSpec("tiny", 64, 176, 2, 4, 2, 320, 1024, 16),
        # The peer workload model of the executor benchmark (44.6M parameters).
        ModelSpec("peer-45m", 512, 1408, 4, 8, 4, 32000, 2048, 64),
        # Qwen/Qwen2.5-0.5B config.json.
        ModelSpec("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936, 32768, 64, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, tie_word_embeddings=True, qkv_bias=True),
        # meta-llama/Meta-Llama-3-8B config.json.
        ModelSpec("llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, 128,
                  rope_theta=500000.0),
        # meta-llama/Meta-Llama-3-70B config.json.
        ModelSpec("llama-3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, 128,
                  rope_theta=500000.0),
    )
}


def model_spec(name: str) -> ModelSpec:
    """Look up a preset by name, with the list of known names in the error."""
    try:
        return MODEL_SPECS[name]
    except KeyError:
        known = ", ".join(MODEL_SPECS)
        raise ValueError(f"unknown model preset {name!r}; known: {known}") from None
