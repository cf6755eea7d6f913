"""Open a trace from what a user types: a bundled name, a synthetic or vllm: spec, an
inference-perf config or a trace file."""

from __future__ import annotations

from pathlib import Path

from workloads.bundled import BUNDLED, load_bundled
from workloads.formats.inference_perf import is_inference_perf_config, read_inference_perf
from workloads.formats.loaders import load_trace
from workloads.formats.vllm_bench import is_vllm_spec, vllm_trace
from workloads.synthetic.generators import generate_parts, generate_trace, part_rngs
from workloads.synthetic.spec import is_synthetic_spec, parse_parts
from workloads.trace import Trace


def open_trace(source: str, fmt: str | None = None, seed: int = 0) -> Trace:
    """A bundled name, a `synthetic:` spec (drawn from `seed`) or a trace file (`fmt` forced)."""
    if is_synthetic_spec(source):
        if fmt is not None:
            raise ValueError("a format applies to trace files, not to a synthetic spec")
        parts = parse_parts(source, resolve=_open_real)
        return generate_parts(parts, part_rngs(seed, len(parts)), name=source)
    if is_vllm_spec(source):
        if fmt is not None:
            raise ValueError("a format applies to trace files, not to a vllm: spec")
        return vllm_trace(source, part_rngs(seed, 1)[0])
    path = Path(source)
    if fmt == "inference-perf" or (fmt is None and path.is_file()
                                   and is_inference_perf_config(path)):
        return generate_trace(read_inference_perf(path), part_rngs(seed, 1)[0], name=path.name)
    return _open_real(source, fmt)


def _open_real(source: str, fmt: str | None = None) -> Trace:
    """A bundled or file trace (not synthetic: an empirical() source must be real data)."""
    if source in BUNDLED:
        if fmt is not None:
            raise ValueError(f"a format applies to trace files, not to bundled {source!r}")
        return load_bundled(source)
    if is_synthetic_spec(source):
        raise ValueError(f"empirical({source}): the source must be a bundled name or a file")
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(
            f"trace {source!r}: no such file; expected a bundled name "
            f"({', '.join(BUNDLED)}), a synthetic: spec, a .csv/.jsonl/.parquet/.sqlite/.json "
            "file or an inference-perf .yml config"
        )
    return load_trace(path, fmt)
