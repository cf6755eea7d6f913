"""Turn a workloads Trace into scheduler Requests (trace output length = max_new_tokens)."""

from __future__ import annotations

from sim.core import Request, SamplingParams
from workloads.trace import Trace


def requests_from_trace(trace: Trace, sampling: SamplingParams | None = None) -> list[Request]:
    """One Request per trace row; EOS is ignored so outputs have the trace's lengths."""
    params = sampling or SamplingParams()
    arrivals = trace.arrival_s.tolist()
    prompts = trace.prompt_len.tolist()
    outputs = trace.output_len.tolist()
    return [
        Request(rid, arrival, prompt, output, sampling=params)
        for rid, arrival, prompt, output in zip(
            trace.request_ids, arrivals, prompts, outputs, strict=True
        )
    ]
