"""vLLM bench's ShareGPT JSON: a list of conversations; each becomes one request whose prompt
is the first turn and whose output is the second, as `vllm bench serve` samples them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from workloads.validate import TraceError

MIN_TOKENS = 4  # vLLM drops pairs whose prompt or output is shorter than this


def read_sharegpt(path: Path) -> pd.DataFrame:
    """Requests from a ShareGPT file, all arriving at 0 (vLLM's default rate, inf).

    Lengths are UTF-8 bytes: the tokens of servelab's byte-level tokenizer (a model's BPE
    tokenizer gives about a quarter as many for English: --length-scale 0.25).
    """
    source = str(path)
    try:
        conversations = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(source, f"not ShareGPT JSON ({exc})") from None
    if not isinstance(conversations, list):
        raise TraceError(source, "expected a JSON list of conversations")
    prompt, output = [], []
    for index, entry in enumerate(conversations):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            raise TraceError(source, "expected a list of turns", line=index + 1,
                             field="conversations", unit="entry")
        if len(turns) < 2:
            continue  # vLLM skips conversations without an answer
        lengths = [_turn_bytes(turn, source, index) for turn in turns[:2]]
        if min(lengths) < MIN_TOKENS:
            continue
        prompt.append(lengths[0])
        output.append(lengths[1])
    if not prompt:
        raise TraceError(source, "no conversation has a prompt and an answer of >= 4 tokens")
    return pd.DataFrame({
        "arrival_s": np.zeros(len(prompt)),
        "prompt_len": np.asarray(prompt, dtype=np.int64),
        "output_len": np.asarray(output, dtype=np.int64),
        "request_id": pd.Series(np.arange(len(prompt)).astype(str), dtype=str),
    })


def _turn_bytes(turn: object, source: str, index: int) -> int:
    value = turn.get("value") if isinstance(turn, dict) else None
    if not isinstance(value, str):
        raise TraceError(source, f"expected a turn with a string value, got {turn!r:.60}",
                         line=index + 1, field="conversations", unit="entry")
    return len(value.encode("utf-8"))
