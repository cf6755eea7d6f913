"""Step times from vLLM's own measured kernels: every layer's GEMMs, attention, MoE and
all-reduces read from tables of one GPU and vLLM version (sim.cost.kernel_tables).

A step's time is, per layer: the QKV and O GEMMs, prefill attention over each chunk's
context and decode attention by rows and mean KV length (never faster than the GPU's memory
reads that KV), the MLP's GEMMs or the fused-MoE layer at its tokens, two all-reduces of
[tokens, hidden] (vLLM's custom all-reduce below its size limit, NCCL above); then the LM
head GEMM over the rows that sample. Norms, RoPE, activations, FP8 activation quantization
and the sampler have no table: they keep the fitted model's small-op and sampler terms, as
does the engine's host time (sim.cost.engine_overhead). The step adds up as the fitted
model's does (GpuCostModel), so everything that drives that model drives this one.
"""

from __future__ import annotations

from sim.cost.engine_overhead import EngineOverhead, load_engine
from sim.cost.gpu_cost import GpuCostModel
from sim.cost.gpu_shapes import GpuPeaks, LayerShapes
from sim.cost.gpu_terms import across_nodes_s
from sim.cost.kernel_curves import Curve, Grid, blend, streamed_ms_per_token
from sim.cost.kernel_tables import KernelTableError, KernelTables
from sim.engine.core import BatchPlan
from sim.specs.hardware import HardwareSpec
from sim.specs.model_specs import ModelSpec

MS = 1e-3  # tables hold milliseconds


def gemm_quant(quantization: str | None, dtype: str, measured: list[str]) -> str:
    """The GEMM table that prices a deployment's linear layers: fp8 under --quantization
    fp8, else the 16-bit dtype's (fp16 runs the same tensor-core rate as bf16, so an fp16
    deployment reads bf16's table where fp16 was not measured). KernelTableError when the
    table is missing or the quantization has none."""
    if quantization not in (None, "fp8"):
        raise KernelTableError(f"quantization {quantization!r}: the kernel tables price "
                               "16-bit and fp8 linear layers only")
    want = "fp8" if quantization else dtype
    if want == "fp16" and "fp16" not in measured:
        want = "bf16"
    if want not in measured:
        raise KernelTableError(f"no {want} GEMMs measured (tables hold "
                               f"{', '.join(measured) or 'none'})")
    return want


class KernelCostModel(GpuCostModel):
    """A GpuCostModel whose GEMMs, attention, MoE layers and all-reduces are vLLM's
    measured kernels (tables) instead of fitted efficiencies."""

    name = "vllm-kernels"

    def __init__(self, shapes: LayerShapes, peaks: GpuPeaks, engine: EngineOverhead,
                 tables: KernelTables, tensor_parallel: int = 1, expert_parallel: int = 1,
                 dtype: str = "bf16", quantization: str | None = None,
                 kv_cache_dtype: str = "auto") -> None:
        super().__init__(shapes, peaks, engine, tensor_parallel, expert_parallel,
                         dtype_bytes=2, quantization=quantization,
                         kv_cache_dtype=kv_cache_dtype)
        if shapes.kv_lora_rank:
            raise KernelTableError(f"{shapes.name}: latent attention (MLA) is not priced "
                                   "from the kernel tables")
        self.tables = tables
        self.notes: list[str] = []  # shapes priced from a neighbour, for the description
        quant = self._block_fp8(quantization) or gemm_quant(quantization, dtype,
                                                            tables.gemm_quants())
        base = gemm_quant(None, dtype, tables.gemm_quants())  # lm_head and router: 16-bit
        s, tp, h = shapes, tensor_parallel, shapes.hidden_size
        self._qkv = tables.gemm(quant, self._q_dim + 2 * self._kv_dim, h)
        self._o = tables.gemm(quant, h, self._q_dim)
        self._lm_head = tables.gemm(base, s.vocab_size // tp, h)
        self._mlp_curves(quant, base)
        # A GPU file's own measured all-reduces (--gpu-file) beat the tables, as they beat
        # the fitted curve (sim.cost.gpu_terms.load_terms puts them in self.terms).
        own = {n for n, _, _ in peaks.allreduce}
        self._ar = tables.all_reduce(tp) if tp > 1 and tp not in own else None
        if tp > 1 and tp in own:
            self.notes.append(f"all-reduce over {tp} GPUs from the GPU file")
        self._attention_grids(kv_cache_dtype)
        self._decode_rows: dict[int, Curve] = {}  # decode attention by rows (predict's)
        self._fewest_experts_ms = self._fewest_experts_read_ms()

    def _attention_grids(self, kv_cache_dtype: str) -> None:
        """Prefill and decode attention over the deployment's KV cache: the FP8-KV tables
        where this GPU and version measured them, else the 16-bit ones with decode scaled
        by the KV bytes it reads (the description says so)."""
        s, tables, heads = self.shapes, self.tables, self.shapes.num_heads // self.tensor_parallel
        kv = "auto" if kv_cache_dtype == "auto" else "fp8"
        measured = all(kv in tables.kv_cache_dtypes(name)
                       for name in ("context_attention", "generation_attention"))
        table_kv = kv if measured else "auto"
        self._context, note = tables.context_attention(heads, self._kv_heads, s.head_dim,
                                                       table_kv)
        self.notes += [note] if note else []
        self._generation, note = tables.generation_attention(heads, self._kv_heads,
                                                             s.head_dim, table_kv)
        self.notes += [note] if note else []
        if kv != table_kv:
            scale = self._kv_bytes_layer / (2 * self._kv_dim * self.dtype_bytes)
            self._generation = Grid({b: blend([(c, 1.0)], scale)
                                     for b, c in self._generation.rows.items()})
            self.notes.append(f"{kv_cache_dtype} KV cache: no FP8-KV attention measured, so "
                              f"decode attention is the 16-bit table x{scale:g} (the KV "
                              "bytes it reads) and prefill attention the 16-bit table "
                              "(extrapolated)")
        elif kv != "auto":
            self.notes.append(f"{kv_cache_dtype} KV cache: attention from the FP8-KV tables")
        self._kv_ms_per_token = streamed_ms_per_token(self._generation, self._kv_bytes_layer)

    def _block_fp8(self, quantization: str | None) -> str | None:
        """"fp8_block" for an FP8 checkpoint with block scales where the tables measure
        those kernels (vLLM runs its block-scaled GEMMs and MoE), else None."""
        if (quantization != "fp8" or not self.shapes.weight_block_size
                or "fp8_block" not in self.tables.gemm_quants()):
            return None
        block = self.shapes.weight_block_size
        self.notes.append(f"block-scaled fp8 GEMMs and MoE ({block} x {block} weight blocks)")
        return "fp8_block"

    def _mlp_curves(self, quant: str, base: str) -> None:
        """The dense MLP's GEMMs; an MoE layer's fused experts, router (16-bit), shared
        expert and, under expert parallelism across data-parallel ranks, their exchange."""
        s, tables, tp, h = self.shapes, self.tables, self.tensor_parallel, self.shapes.hidden_size
        gates = 2 if s.gated_mlp else 1
        if not s.is_moe or s.num_dense_layers:
            inter = s.intermediate_size // tp
            self._dense = (tables.gemm(quant, gates * inter, h), tables.gemm(quant, h, inter))
        if not s.is_moe:
            return
        ep = self.expert_parallel
        # Experts in their own format (gpt-oss's MXFP4) read that format's table.
        self._moe = tables.moe(s.expert_quantization or quant, h, s.moe_intermediate_size,
                               s.num_experts, s.experts_per_token, 1 if ep > 1 else tp, ep)
        self._router = tables.gemm(base, s.num_experts, h)
        if s.shared_expert_intermediate_size:
            inter = s.shared_expert_intermediate_size // tp
            self._shared = (tables.gemm(quant, gates * inter, h), tables.gemm(quant, h, inter))
        # (over more GPUs than a node holds: the node's measured exchange, and
        # across_nodes_s for the hop between nodes)
        self._exchange = self._exchange_curve(min(ep, self.peaks.max_gpus))
        if self._exchange is not None and ep > self.peaks.max_gpus:
            across_nodes_s(self.peaks, 1.0, ep)  # refuses a GPU with no network, by name
            self.notes.append(f"experts' exchange over {ep} GPUs: the {self.peaks.max_gpus}-GPU "
                              "exchange within a node, then the network between nodes "
                              f"({self.peaks.network_bytes_s / 1e9:g} GB/s a GPU)")

    def _fewest_experts_read_ms(self) -> float:
        """The least a fused-MoE layer can take on one GPU (ms): the weights of the fewest
        routed experts it can hold for a step, read from memory at the rate the decode
        attention table streams KV (`_streamed_ms`). Every token picks its top-k distinct
        experts, so the busiest of ep GPUs holds at least k / ep of them (rounded up). The
        MoE table, timed in a loop like the attention table, reads a few experts that fit
        the L2 cache from there (the L40S's: 8 of Qwen3-30B-A3B's, 75 MB, at 2.2 TB/s)."""
        s = self.shapes
        if not s.is_moe or not self._kv_ms_per_token:
            return 0.0
        ep = self.expert_parallel
        inter = s.moe_intermediate_size // (self.tensor_parallel if ep == 1 else 1)
        matrices = 3 if s.gated_mlp else 2
        expert_bytes = matrices * s.hidden_size * inter * self._expert_bytes
        fewest = -(-s.experts_per_token // ep)
        return fewest * expert_bytes * self._kv_ms_per_token / self._kv_bytes_layer

    def _exchange_curve(self, num_gpus: int):
        """The experts' exchange between data-parallel ranks (ms against message bytes): the
        GPU file's own all-reduce over `num_gpus` where it measured one (as for TP), else
        the tables' NCCL all-gather and reduce-scatter, else their all-reduce (the same
        bytes); None without data parallelism."""
        if self.data_parallel == 1:
            return None
        if num_gpus in {n for n, _, _ in self.peaks.allreduce}:
            self.notes.append(f"experts' exchange over {num_gpus} GPUs from the GPU file")
            return lambda message_bytes: self.terms.allreduce_s(message_bytes, num_gpus) / MS
        measured = self.tables.exchange(num_gpus)
        if measured is not None:
            return measured
        self.notes.append(f"experts' exchange over {num_gpus} GPUs priced as an all-reduce "
                          "(no all-gather or reduce-scatter measured)")
        return self.tables.all_reduce(num_gpus)

    def describe(self) -> str:
        """What priced the steps, and any shape priced from a measured neighbour."""
        return "; ".join([self.tables.describe(), *self.notes])

    # ---- per-token parts (cached by token count in GpuCostModel.predict) ---------------

    def _allreduce_s(self, message_bytes: float) -> float:
        if self._ar is None:  # one GPU (0), or the GPU file's measurement
            return self.terms.allreduce_s(message_bytes, self.tensor_parallel)
        return self._ar(message_bytes) * MS

    def layer_s(self, tokens: int) -> float:
        """One layer's GEMMs, MLP or MoE, small ops and two all-reduces (no attention)."""
        h, b = self.shapes.hidden_size, self.dtype_bytes
        layer = (self._qkv(tokens) + self._o(tokens)) * MS
        if self.quantization:  # activations quantized before QKV and O
            layer += self._quantize(tokens * h) + self._quantize(tokens * self._q_dim)
        layer += self.mlp_s(tokens)
        layer = self.plus_norms_rope_s(layer, tokens, self._kv_dim)
        return layer + 2 * self._allreduce_s(tokens * h * b)

    def mlp_s(self, tokens: int, group_tokens: int | None = None) -> float:
        """One layer's MLP averaged over the model's layers: dense GEMMs, or the fused-MoE
        layer at the tokens its GPU's experts see (every data-parallel rank's under expert
        parallelism: `group_tokens`, default as many on each rank as here)."""
        s = self.shapes
        if not s.is_moe:
            return self._gated_mlp_s(tokens, self._dense, s.intermediate_size)
        moe = self.moe_mlp_s(tokens, group_tokens)
        if not s.num_dense_layers:
            return moe
        dense = self._gated_mlp_s(tokens, self._dense, s.intermediate_size)
        return (s.num_moe_layers * moe + s.num_dense_layers * dense) / s.num_layers

    def _gated_mlp_s(self, tokens: int, gemms: tuple, intermediate: int) -> float:
        """Up (gate and up) GEMM, activation, down GEMM, on this GPU's share."""
        s, b, h = self.shapes, self.dtype_bytes, self.shapes.hidden_size
        inter = intermediate // self.tensor_parallel
        gates = 2 if s.gated_mlp else 1
        out = (gemms[0](tokens) + gemms[1](tokens)) * MS
        out += self._small((gates + 1) * tokens * inter * b)
        if self.quantization:
            out += self._quantize(tokens * h) + self._quantize(tokens * inter)
        return out

    def moe_mlp_s(self, tokens: int, group_tokens: int | None = None) -> float:
        """The router GEMM, the measured fused-MoE layer (routing, experts, combine) at the
        tokens reaching this GPU, the ranks' exchange and any shared expert."""
        s, b, h = self.shapes, self.dtype_bytes, self.shapes.hidden_size
        group = tokens * self.data_parallel if group_tokens is None else group_tokens
        experts = self._moe(group)
        if experts < self._fewest_experts_ms:
            experts = self._fewest_experts_ms
        out = (self._router(tokens) + experts) * MS
        if self._exchange is not None:  # all-gather in, reduce-scatter out
            message = group * h * b
            out += (self._exchange(message) * MS
                    + across_nodes_s(self.peaks, message, self.expert_parallel))
        if s.shared_expert_intermediate_size:
            out += self._gated_mlp_s(tokens, self._shared, s.shared_expert_intermediate_size)
            if s.shared_expert_gate:
                # (a one-output GEMV: below the tables' narrowest GEMM, the fitted term)
                out += self._gemm(tokens, h, 1) + self._small(3 * tokens * h * b)
        return out

    def sample_s(self, rows: int) -> float:
        """LM head GEMM over the sampling rows, the vocab shards' gather, the sampler."""
        if not rows:
            return 0.0
        s, t, b = self.shapes, self.terms, self.dtype_bytes
        head = self._lm_head(rows) * MS
        if self.tensor_parallel > 1:  # the gather moves about half an all-reduce's bytes
            head += self._allreduce_s(rows * s.vocab_size // self.tensor_parallel * b) / 2
        return head + t.sampler_floor_s + t.sampler_per_row_s * rows

    # ---- attention, per layer -----------------------------------------------------------

    def prefill_attention_s(self, plan: BatchPlan) -> float:
        """One layer's prefill attention: the table at the chunks' batch and mean KV length
        after them (token-weighted), scaled from the table's b x L^2 / 2 causal pairs to the
        plan's, and never below the same chunks without context (a launch floor). A
        sliding-window layer (gpt-oss) attends to at most `window` keys a token: its pairs
        are bounded by tokens x window, its floor by a window-long chunk; the result is the
        layers' mean."""
        seqs, tokens = plan.prefill_seqs or 1, plan.prefill_tokens
        row = self._context.row(seqs)
        chunk = tokens / seqs
        full = plan.prefill_attn / tokens  # (a plan that left the totals unset: no context)
        if full < chunk:
            full = chunk
        pairs = plan.prefill_attn_causal or seqs * full * full / 2
        out = _scaled_pairs_s(row, seqs, full, pairs, chunk)
        if self._window:
            window = self._window
            windowed = _scaled_pairs_s(row, seqs, full, min(pairs, tokens * window),
                                       min(chunk, window))
            out += self._window_share * (windowed - out)
        return out * MS

    def _with_attention(self, plan: BatchPlan, layer: float,
                        host: float) -> tuple[float, float]:
        """A layer's GPU and host time with the step's attention from the measured tables.
        The decode table times decode-only batches; beside a prefill chunk vLLM runs every
        row in one varlen kernel, where decode rows lose their GQA sharing: their time is
        scaled by the measured mixed-kernel factor, as in the fitted model."""
        decode_seqs = plan.decode_seqs
        if plan.prefill_tokens:
            layer += self.prefill_attention_s(plan)
            host += self._kernel_s
        if decode_seqs:
            curve = self._decode_rows.get(decode_seqs)
            if curve is None:
                curve = self._decode_rows[decode_seqs] = self._generation.row(decode_seqs)
            kv_per_row = plan.decode_context / decode_seqs
            decode = self._decode_mean_s(decode_seqs, curve, kv_per_row)
            if plan.prefill_tokens:
                decode *= self.terms.mixed_decode_factor(decode_seqs, kv_per_row, self._group)
            layer += decode
            host += self._kernel_s
        return layer, host

    def _decode_mean_s(self, rows: int, curve: Curve, context: float) -> float:
        """One layer's decode attention of `rows` rows at a mean KV length, averaged over the
        layers: a sliding-window layer reads at most the window."""
        out = self._streamed_ms(rows, curve, context)
        if self._window and context > self._window:
            out += self._window_share * (self._streamed_ms(rows, curve, self._window) - out)
        return out * MS

    def _streamed_ms(self, rows: int, curve: Curve, context: float) -> float:
        """The table's decode attention, never below reading the rows' KV from memory at the
        rate the table itself measured on KV far larger than any cache (ms). The tables time
        a kernel replayed in a loop, so a KV that fits the GPU's L2 cache is read from there;
        in a model's step every other layer passes between two reads of one layer's KV."""
        out = curve(context)
        floor = rows * context * self._kv_ms_per_token
        return out if out > floor else floor

    def _decode_attention_s(self, rows: int, contexts: range) -> list[float]:
        """One layer's decode attention of `rows` rows from the measured table."""
        curve = self._generation.row(rows)
        if not self._window:  # (the common case, kept to one call a step: the replay's hot path)
            per_token = self._kv_ms_per_token
            return [max(curve(ctx / rows), ctx * per_token) * MS for ctx in contexts]
        return [self._decode_mean_s(rows, curve, ctx / rows) for ctx in contexts]


def _scaled_pairs_s(row: Curve, seqs: int, length: float, pairs: float, floor_len: float
                    ) -> float:
    """The context-attention row at `length`, scaled from its seqs x length^2 / 2 causal
    pairs to `pairs`, never below the row at `floor_len` (ms)."""
    scaled = row(length) * pairs / (seqs * length * length / 2)
    alone = row(floor_len)
    return scaled if scaled > alone else alone


def kernel_cost_backend(model: ModelSpec, hardware: HardwareSpec, tables: KernelTables,
                        tensor_parallel: int = 1, expert_parallel: int = 1,
                        dtype: str = "bf16", quantization: str | None = None,
                        engine: str = "vllm", kv_cache_dtype: str = "auto") -> KernelCostModel:
    """The measured-kernel model for a servelab ModelSpec on a HardwareSpec, as vLLM runs it."""
    return KernelCostModel(LayerShapes.from_model_spec(model),
                           hardware, load_engine(engine, vllm_version=tables.vllm_version),
                           tables,
                           tensor_parallel=tensor_parallel, expert_parallel=expert_parallel,
                           dtype=dtype, quantization=quantization,
                           kv_cache_dtype=kv_cache_dtype)
