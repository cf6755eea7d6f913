"""Read an inference-perf config file (YAML) as a synthetic spec: its `data` (shared_prefix,
random or synthetic) and its `load` (constant or poisson stages of rate and duration)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from workloads.synthetic.arrivals import Stage
from workloads.synthetic.generators import SyntheticSpec
from workloads.synthetic.lengths import Fixed, LengthDist, to_lengths

# Top-level sections of an inference-perf config: a YAML file starting with one is ours.
_SECTIONS = ("load", "data", "api", "server", "tokenizer", "metrics", "report", "storage")
_FIRST_KEY = re.compile(rb"^(%s)\s*:" % b"|".join(s.encode() for s in _SECTIONS))
DATA_TYPES = ("shared_prefix", "random", "synthetic")
LOAD_TYPES = {"constant": "constant", "poisson": "poisson"}
# shared_prefix keys, old name -> new name (inference-perf renamed them; both are read).
_RENAMED = {"num_groups": "num_unique_system_prompts",
            "num_prompts_per_group": "num_users_per_system_prompt"}
_SHARED_KEYS = {"num_unique_system_prompts", "num_users_per_system_prompt", "system_prompt_len",
                "question_len", "question_len_min", "question_len_max", "question_len_std",
                "output_len", "output_len_min", "output_len_max", "output_len_std",
                "enable_multi_turn_chat", *_RENAMED}


class ConfigError(ValueError):
    """An inference-perf config servelab cannot read; the message names the file and field."""

    def __init__(self, path: str, field: str, problem: str) -> None:
        super().__init__(f"{path}: {field}: {problem}")


def is_inference_perf_config(path: Path) -> bool:
    """Whether the file is YAML whose first key is an inference-perf section."""
    if path.suffix.lower() not in (".yml", ".yaml"):
        return False
    with open(path, "rb") as file:
        for line in file:
            if line.strip() and not line.lstrip().startswith(b"#"):
                return bool(_FIRST_KEY.match(line))
    return False


@dataclass(frozen=True)
class ClippedNormal:
    """inference-perf's length distribution: Normal(mean, std) clipped to [low, high]."""

    mean: float
    std: float
    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high or self.std < 0:
            raise ValueError(f"need 1 <= min <= max and std >= 0, got {self}")

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        return np.clip(to_lengths(rng.normal(self.mean, self.std, count)), self.low, self.high)


def read_inference_perf(path: str | Path) -> SyntheticSpec:
    """The config's data and load as a SyntheticSpec; unsupported parts raise naming them."""
    source = str(path)
    try:
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(source, "YAML", str(exc).splitlines()[0]) from None
    if not isinstance(config, dict):
        raise ConfigError(source, "top level", "expected a mapping of sections")
    data, load = _section(config, "data", source), _section(config, "load", source)
    kind = data.get("type")
    if kind not in DATA_TYPES:
        raise ConfigError(source, "data.type",
                          f"{kind!r} is not supported (supported: {', '.join(DATA_TYPES)})")
    stages, arrival = _load(load, source)
    common = {"num_requests": None, "rate_per_s": None, "stages": stages, "arrival": arrival}
    try:
        if kind == "shared_prefix":
            return _shared_prefix(_section(data, "shared_prefix", source, "data."), source,
                                  common)
        prompt = _distribution(data, "input_distribution", source)
        output = _distribution(data, "output_distribution", source)
        return SyntheticSpec(prompt=prompt, output=output, **common)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(source, f"data.{kind}", str(exc)) from None


def _section(parent: dict, key: str, source: str, prefix: str = "") -> dict:
    value = parent.get(key)
    if not isinstance(value, dict):
        raise ConfigError(source, prefix + key, "missing, or not a mapping")
    return value


def _load(load: dict, source: str) -> tuple[tuple[Stage, ...], str]:
    kind = load.get("type", "constant")
    if kind not in LOAD_TYPES:
        raise ConfigError(source, "load.type",
                          f"{kind!r} is not supported (supported: {', '.join(LOAD_TYPES)})")
    raw = load.get("stages")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(source, "load.stages", "expected a list of {rate, duration}")
    stages = []
    for index, stage in enumerate(raw):
        field = f"load.stages[{index}]"
        if not isinstance(stage, dict) or set(stage) != {"rate", "duration"}:
            keys = sorted(stage) if isinstance(stage, dict) else stage
            raise ConfigError(source, field, f"expected exactly rate and duration, got {keys}")
        try:
            stages.append(Stage("rate", float(stage["rate"]),
                                duration_s=float(stage["duration"])))
        except (TypeError, ValueError) as exc:
            raise ConfigError(source, field, str(exc)) from None
    return tuple(stages), LOAD_TYPES[kind]


def _shared_prefix(block: dict, source: str, common: dict) -> SyntheticSpec:
    unknown = sorted(set(block) - _SHARED_KEYS)
    if unknown:
        raise ConfigError(source, f"data.shared_prefix.{unknown[0]}", "unknown key")
    if block.get("enable_multi_turn_chat"):
        raise ConfigError(source, "data.shared_prefix.enable_multi_turn_chat",
                          "multi-turn chat is not supported here; write a synthetic: spec "
                          "with users=, turns= and think= for conversations")
    values = {_RENAMED.get(key, key): value for key, value in block.items()}
    for key in ("num_unique_system_prompts", "num_users_per_system_prompt",
                "system_prompt_len", "question_len", "output_len"):
        if not isinstance(values.get(key), int) or isinstance(values.get(key), bool):
            raise ConfigError(source, f"data.shared_prefix.{key}", "missing, or not an integer")
    return SyntheticSpec(
        prompt=_length(values, "question_len"),
        output=_length(values, "output_len"),
        system_tokens=values["system_prompt_len"],
        groups=values["num_unique_system_prompts"],
        prompts_per_group=values["num_users_per_system_prompt"],
        question=True,
        **common,
    )


def _length(values: dict, key: str) -> LengthDist:
    """A fixed length, or a clipped normal when any of _min, _max, _std is given."""
    mean = values[key]
    if not any(f"{key}_{part}" in values for part in ("min", "max", "std")):
        return Fixed(mean)
    return ClippedNormal(mean, float(values.get(f"{key}_std", 0.0)),
                         int(values.get(f"{key}_min", 1)), int(values.get(f"{key}_max", 10**9)))


def _distribution(data: dict, key: str, source: str) -> LengthDist:
    """input_distribution / output_distribution: {min, max, mean, std_dev} (inference-perf's
    defaults for the ones left out)."""
    raw = data.get(key) or {}
    if not isinstance(raw, dict):
        raise ConfigError(source, f"data.{key}", "expected a mapping")
    unknown = sorted(set(raw) - {"min", "max", "mean", "std_dev", "total_count"})
    if unknown:
        raise ConfigError(source, f"data.{key}.{unknown[0]}", "unknown key")
    return ClippedNormal(float(raw.get("mean", 512)), float(raw.get("std_dev", 200)),
                         int(raw.get("min", 10)), int(raw.get("max", 1024)))
