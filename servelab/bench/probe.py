"""Probing a running OpenAI-compatible server: its published limits, and probes sent through
the load client with prompts no cache can serve (servelab.calibration.remote designs and reads
them)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from servelab.bench.client import BenchRequest, model_card, run_bench
from servelab.bench.connection import BenchConfig, make_client
from servelab.calibration.remote import Probe, ServerLimits
from servelab.serve.metrics import CACHE_INFO, KERNEL_INFO
from sim.engine.core import FinishReason, Request


async def read_limits(config: BenchConfig, max_num_seqs: int, token_budget: int
                      ) -> tuple[ServerLimits, dict]:
    """The server's limits (max_model_len from /v1/models; block size, KV blocks and prefix
    caching from vLLM's `vllm:cache_config_info` on /metrics, and the row knots from
    `servelab:kernel_info`, where published; the rest as given), and its model card."""
    async with make_client(config) as client:
        card = await model_card(client, config.model)
        infos = await _info_labels(client)
    info = infos.get(CACHE_INFO, {})
    knots = infos.get(KERNEL_INFO, {}).get("row_knots", "")
    max_len = card.get("max_model_len")
    if not max_len:
        raise ValueError(f"{config.url} does not publish max_model_len on /v1/models")
    blocks = info.get("num_gpu_blocks") or info.get("num_blocks")
    caching = info.get("enable_prefix_caching", "True")
    limits = ServerLimits(int(max_len), token_budget, max_num_seqs,
                          int(info["block_size"]) if info.get("block_size") else None,
                          int(blocks) if blocks and blocks != "None" else None,
                          caching.lower() == "true",
                          tuple(int(k) for k in knots.split(",") if k))
    return limits, card


async def _info_labels(client: aiohttp.ClientSession) -> dict[str, dict[str, str]]:
    """The labels of each info gauge (`vllm:cache_config_info`, `servelab:kernel_info`) on
    /metrics, by name; those absent are left out."""
    try:
        async with client.get("metrics") as response:
            text = await response.text() if response.status == 200 else ""
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return {}
    return {family.name: dict(family.samples[0].labels)
            for family in text_string_to_metric_families(text)
            if family.name in (CACHE_INFO, KERNEL_INFO) and family.samples}


async def run_probes(probes: list[Probe], config: BenchConfig, vocab_size: int, seed: int = 0,
                     on_probe: Callable[[], None] | None = None) -> list[list[Request]]:
    """Send each probe's requests at their times, one probe after another; each request as
    the client saw it. Prompts are fresh random tokens, so no prefix cache serves them."""
    rng = np.random.default_rng(seed)
    seen = []
    for i, probe in enumerate(probes):
        requests = [BenchRequest(f"probe{i}-{j}", r.send_s,
                                 rng.integers(3, vocab_size, r.prompt_len).tolist(),
                                 r.max_tokens) for j, r in enumerate(probe.requests)]
        result = await run_bench(requests, config)
        failed = [r for r in result.requests if r.finish_reason is not FinishReason.LENGTH]
        if failed:
            raise ValueError(f"{config.url}: probe request {failed[0].request_id} failed: "
                             f"{failed[0].finish_detail or failed[0].finish_reason}")
        seen.append(result.requests)
        if on_probe is not None:
            on_probe()
    return seen
