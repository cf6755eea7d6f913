"""The draft model on the executor: a smaller model (or the target's own first N layers)
proposes k tokens per verifying row, k forward passes batched over the rows.

The drafter keeps its own paged KV per request, in a pool of its own. Before each step it
compares the tokens its KV holds with the row's sequence: the longest common prefix stays
(accepted proposals were computed as proposals, so they stay too), the rest is recomputed.
Pass 1 computes the row's tokens past that prefix and proposes d1; pass j computes d(j-1) and
proposes dj. Greedy rows take the drafter's argmax; sampling rows draw from the drafter's
distribution q with a generator of their own seed stream, and keep q for rejection sampling.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from executor.batch import Segment, build_step_inputs
from executor.config import ModelArgs
from executor.kv_cache import KVCache
from executor.model import Transformer
from executor.sampling import argmax_rows, is_greedy, target_probs
from executor.weights import load_hf_model, random_model
from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, Request, token_seed
from sim.engine.speculation.config import DRAFTER_METHODS, SpeculativeConfig

# The drafter's draws use their own seed stream, independent of the target's for the same
# output index: acceptance must not correlate with how the proposal was drawn.
_DRAFT_SEED_SALT = 0x5DEECE66D


def first_layers_model(target: Transformer, num_layers: int) -> Transformer:
    """A Transformer sharing the target's embedding, first num_layers blocks, final norm and
    LM head (no copies)."""
    if not 1 <= num_layers <= target.args.n_layers:
        raise ValueError(f"draft_num_layers {num_layers}: the target has "
                         f"{target.args.n_layers} layers")
    with torch.device("meta"):
        model = Transformer(replace(target.args, n_layers=num_layers))
    model.tok_embeddings = target.tok_embeddings
    model.layers = torch.nn.ModuleList(list(target.layers)[:num_layers])
    model.norm, model.output, model.native = target.norm, target.output, target.native
    return model


class DraftModel:
    """Proposes tokens for a plan's verifying rows (plan.num_spec_tokens) with a drafter."""

    def __init__(self, model: Transformer, target_vocab: int, num_blocks: int,
                 block_size: int, device: torch.device, dtype: torch.dtype) -> None:
        if model.args.vocab_size != target_vocab:
            raise ValueError(f"draft model {model.args.name} has a vocabulary of "
                             f"{model.args.vocab_size}, the target {target_vocab}")
        self.model = model
        self.device = device
        self.block_manager = BlockManager(num_blocks, block_size)
        self.kv = KVCache(model.args, num_blocks, block_size, device, dtype)
        # Per request, the drafter's view: its tokens (the sequence, then its proposals) as
        # a prompt, num_computed_tokens the positions its KV holds.
        self._views: dict[str, Request] = {}
        # Sampling rows' proposal distributions of the last propose: request_id -> [k, vocab].
        self.proposal_probs: dict[str, torch.Tensor] = {}
        # perf_counter seconds at the start of the last propose and at the end of each of its
        # passes: pass 1 includes matching each row's KV, later passes are one token a row.
        self.pass_marks_s: list[float] = []

    def propose(self, plan: BatchPlan) -> None:
        """Fill plan.spec_token_ids for every verifying row of the plan."""
        self.proposal_probs = {}
        self.pass_marks_s = [time.perf_counter()]
        for rid in plan.preempted:
            self.free(rid)
        rows = [(r, plan.num_spec_tokens[r.request_id]) for r in plan.requests
                if r.request_id in plan.num_spec_tokens]
        if not rows:
            return
        views = [self._view(request, k, {r.request_id for r, _ in rows}) for request, k in rows]
        drafts: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        for step in range(max(k for _, k in rows)):
            live = [i for i, (_, k) in enumerate(rows) if k > step]
            segments = [self._segment(views[i], step) for i in live]
            inputs = build_step_inputs(segments, self.block_manager, self.model.args,
                                       self.device, paged=self.model.native)
            logits = self.model(inputs, self.kv)  # [len(live), vocab]
            for row, i in enumerate(live):
                request = rows[i][0]
                token, q = self._choose(logits[row], request, len(drafts[i]))
                drafts[i].append(token)
                if q is not None:
                    probs[i].append(q)
                views[i].prompt_token_ids.append(token)
                views[i].num_computed_tokens = views[i].prompt_len + step
            self.pass_marks_s.append(time.perf_counter())
        for i, (request, _) in enumerate(rows):
            plan.spec_token_ids[request.request_id] = drafts[i]
            if probs[i]:
                self.proposal_probs[request.request_id] = torch.stack(probs[i])

    def _view(self, request: Request, k: int, keep: set[str]) -> Request:
        """The drafter's view of a row: its KV's prefix that still matches the sequence,
        blocks for the k proposals' passes (evicting other requests' drafter KV if short)."""
        tokens = request.token_ids()
        view = self._views.get(request.request_id)
        held = 0
        if view is not None:
            old = view.prompt_token_ids
            n = min(len(old), len(tokens), view.num_computed_tokens)
            mismatch = np.flatnonzero(np.asarray(old[:n]) != np.asarray(tokens[:n]))
            held = int(mismatch[0]) if mismatch.size else n
        view = Request(request.request_id, 0.0, len(tokens), 1, prompt_token_ids=list(tokens))
        view.num_computed_tokens = held
        self._views[request.request_id] = view
        need = len(tokens) + k - 1  # positions through proposal k - 1 get KV
        for other in list(self._views):
            if self.block_manager.try_allocate(request.request_id, need):
                return view
            if other not in keep:
                self.free(other)
        self.block_manager.allocate(request.request_id, need)  # raises, naming the shortfall
        return view

    @staticmethod
    def _segment(view: Request, step: int) -> Segment:
        """Pass `step`: the first computes the row's tokens past its KV, a later one the
        proposal before it."""
        if step == 0:
            start = view.num_computed_tokens
            return Segment(view, start, view.prompt_len - start, True)
        return Segment(view, view.prompt_len + step - 1, 1, True)

    def _choose(self, logits: torch.Tensor, request: Request,
                index: int) -> tuple[int, torch.Tensor | None]:
        """A proposal from the drafter's logits [vocab]: the argmax for greedy rows, else a
        draw from q (returned) seeded by the request and the proposal's output index."""
        params = request.sampling
        if is_greedy(params):
            return argmax_rows(logits[None].float())[0], None
        q = target_probs(logits.float(), params)
        seed = token_seed(params.seed ^ _DRAFT_SEED_SALT, len(request.output_token_ids) + index)
        generator = torch.Generator(q.device).manual_seed(seed)
        token = torch.multinomial(q, 1, generator=generator)
        return int(token), q

    def free(self, request_id: str) -> None:
        """Forget a request's drafter KV (it finished, was evicted, or made room)."""
        self._views.pop(request_id, None)
        if self.block_manager.holds(request_id):
            self.block_manager.free(request_id)


def build_drafter(config: SpeculativeConfig | None, target: Transformer,
                  block_manager: BlockManager, seed: int = 0) -> DraftModel | None:
    """The draft model a speculative config names (None for other methods): a preset
    (random weights from seed, as the target's: the target's own preset drafts perfectly)
    or a checkpoint directory, or the target's first draft_num_layers layers; its KV pool as
    large as the target's."""
    if config is None or config.method not in DRAFTER_METHODS:
        return None
    if config.method != "draft_model":
        raise ValueError(f"speculative method {config.method!r} runs in simulation only "
                         "(the executor has no trained EAGLE or MTP head); use ngram or "
                         "draft_model")
    weight = target.tok_embeddings
    if config.draft_num_layers is not None:
        model = first_layers_model(target, config.draft_num_layers)
    else:
        model = _load_drafter(str(config.model), weight.device, weight.dtype, seed)
    return DraftModel(model, target.args.vocab_size, block_manager.num_blocks,
                      block_manager.block_size, weight.device, weight.dtype)


def _load_drafter(name: str, device: torch.device, dtype: torch.dtype,
                  seed: int) -> Transformer:
    try:
        if Path(name).is_dir():
            return load_hf_model(name, device, dtype)
        return random_model(ModelArgs.from_preset(name), seed, device, dtype)
    except (ValueError, OSError) as error:
        raise ValueError(f"draft model {name!r}: {error}") from None
