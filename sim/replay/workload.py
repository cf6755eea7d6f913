"""Turn a workloads Trace into scheduler Requests (trace output length = max_new_tokens;
prefix hash ids, tenants and priorities kept).

In a session, the segment that turn k's prompt gives turn k-1's answer is also turn k-1's
own last segment, over its output tokens: a server caches the answer's blocks as it
generates them and the next turn's prompt carries those very tokens, so the simulated
cache finds the answer where a live one does (workloads.sessions.answer_segments; the
block keys of sim.engine.block_hashes then cover the output).
"""

from __future__ import annotations

import dataclasses
import hashlib

from sim.engine.core import Request, SamplingParams
from sim.replay.simulation import collector_paused
from workloads.sessions import answer_segments
from workloads.trace import Trace


def request_seed(seed: int, request_id: str) -> int:
    """A per-request sampling seed from a run seed and the id, stable across processes."""
    digest = hashlib.blake2b(f"{seed}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def requests_from_trace(trace: Trace, sampling: SamplingParams | None = None,
                        seed_requests: bool = False) -> list[Request]:
    """One Request per trace row; EOS is ignored so outputs have the trace's lengths.

    With seed_requests, each request samples from its own seed, derived from
    sampling.seed and its id, so no two requests share a random stream.
    """
    params = sampling or SamplingParams()
    table = trace.table
    hashes = (table["prefix_hash_ids"].map(tuple).tolist() if trace.has_prefix_hashes
              else [None] * len(trace))
    rows = zip(trace.request_ids, trace.arrival_s.tolist(), trace.prompt_len.tolist(),
               trace.output_len.tolist(), hashes, strict=True)
    tokens = (table["prefix_hash_tokens"].map(tuple).tolist()
              if "prefix_hash_tokens" in table else None)
    with collector_paused():  # (a request's lists are new objects, none of them garbage)
        if not seed_requests:
            requests = [Request(rid, t, p, o, sampling=params, prefix_hash_ids=h)
                        for rid, t, p, o, h in rows]
        else:
            requests = [
                Request(rid, t, p, o, prefix_hash_ids=h,
                        sampling=dataclasses.replace(params, seed=request_seed(params.seed, rid)))
                for rid, t, p, o, h in rows
            ]
    if tokens is not None:  # token-granular prefixes: each id covers its own count
        for request, counts in zip(requests, tokens, strict=True):
            request.prefix_hash_tokens = counts
        for request, answer in zip(requests, answer_segments(trace), strict=True):
            if answer is not None:  # its output is the next turn's segment answer[0]
                request.prefix_hash_ids = (*request.prefix_hash_ids, answer[0])
                request.prefix_hash_tokens = (*request.prefix_hash_tokens, answer[1])
    if "tenant" in table:
        for request, tenant in zip(requests, table["tenant"].tolist(), strict=True):
            request.tenant = str(tenant)
    if "priority" in table:
        for request, priority in zip(requests, table["priority"].tolist(), strict=True):
            request.priority = int(priority)
    return requests

