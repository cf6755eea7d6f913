"""`vllm:KEY=VALUE,...`: vLLM bench's random and prefix_repetition datasets, written with
`vllm bench serve`'s own option names (dashes or underscores), drawn as a synthetic spec."""

from __future__ import annotations

import math

import numpy as np

from workloads.synthetic.generators import SyntheticSpec, generate_trace
from workloads.synthetic.lengths import Fixed, Uniform
from workloads.synthetic.spec import SpecError
from workloads.trace import Trace

VLLM_PREFIX = "vllm:"
# Option -> its default in `vllm bench serve`.
_COMMON = {"dataset_name": None, "num_prompts": 1000, "request_rate": math.inf,
           "burstiness": 1.0}
_RANDOM = {"random_input_len": 1024, "random_output_len": 128, "random_range_ratio": 0.0,
           "random_prefix_len": 0}
_PREFIX_REPETITION = {"prefix_repetition_prefix_len": 256, "prefix_repetition_suffix_len": 256,
                      "prefix_repetition_num_prefixes": 10, "prefix_repetition_output_len": 128}
DATASETS = {"random": _RANDOM, "prefix_repetition": _PREFIX_REPETITION}


def is_vllm_spec(text: str) -> bool:
    """Whether a trace argument is a `vllm:` dataset spec."""
    return text.startswith(VLLM_PREFIX)


def vllm_trace(text: str, rng: np.random.Generator) -> Trace:
    """Draw the requests `vllm bench serve` would send for these options (lengths only)."""
    options = _options(text)
    count = int(options["num_prompts"])
    rate, burstiness = float(options["request_rate"]), float(options["burstiness"])
    if not rate > 0 or not burstiness > 0:
        raise SpecError("vllm: request_rate and burstiness must be > 0")
    try:
        spec = SyntheticSpec(
            count, 1.0 if math.isinf(rate) else rate, **_lengths(options),
            arrival="poisson" if burstiness == 1 else "gamma", cv=1 / math.sqrt(burstiness),
        )
    except ValueError as exc:
        raise SpecError(f"vllm: {exc}") from None
    trace = generate_trace(spec, rng, name=text)
    if math.isinf(rate):  # vLLM's default: every request at once
        return Trace(text, trace.table.assign(arrival_s=np.zeros(len(trace))))
    return trace


def _options(text: str) -> dict:
    """The options with vLLM's defaults filled in; unknown names or values raise."""
    given: dict[str, str] = {}
    for piece in text[len(VLLM_PREFIX):].split(","):
        key, equals, value = piece.strip().partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not equals or not key or not value.strip():
            raise SpecError(f"vllm: item {piece.strip()!r} is not KEY=VALUE")
        given[key] = value.strip()
    dataset = given.get("dataset_name")
    if dataset not in DATASETS:
        raise SpecError(f"vllm: dataset_name={dataset!r}: supported: {', '.join(DATASETS)} "
                        "(a ShareGPT file is read as a trace file itself)")
    defaults = {**_COMMON, **DATASETS[dataset]}
    for key in given:
        if key not in defaults:
            raise SpecError(f"vllm: unknown option {key!r} for dataset {dataset} "
                            f"(known: {', '.join(defaults)})")
    options = dict(defaults)
    for key, value in given.items():
        if key == "dataset_name":
            options[key] = value
            continue
        try:
            options[key] = float(value)
        except ValueError:
            raise SpecError(f"vllm: {key}={value!r} is not a number") from None
    return options


def _lengths(options: dict) -> dict:
    """Prompt and output distributions (and the shared prefix) of the dataset."""
    if options["dataset_name"] == "random":
        ratio = options["random_range_ratio"]
        if not 0 <= ratio < 1:
            raise SpecError(f"vllm: random_range_ratio={ratio:g} must be in [0, 1)")
        prefix = int(options["random_prefix_len"])
        return {"prompt": _around(options["random_input_len"], ratio, "random_input_len"),
                "output": _around(options["random_output_len"], ratio, "random_output_len"),
                "system_tokens": prefix, "question": True}
    return {"prompt": Fixed(int(options["prefix_repetition_suffix_len"])),
            "output": Fixed(int(options["prefix_repetition_output_len"])),
            "system_tokens": int(options["prefix_repetition_prefix_len"]),
            "groups": int(options["prefix_repetition_num_prefixes"]), "question": True}


def _around(length: float, ratio: float, key: str) -> Uniform:
    """vLLM's range: integers from floor(L (1 - r)) to ceil(L (1 + r)), at least 1."""
    low, high = max(1, math.floor(length * (1 - ratio))), math.ceil(length * (1 + ratio))
    if high < 1:
        raise SpecError(f"vllm: {key}={length:g} must be >= 1")
    return Uniform(low, high)
