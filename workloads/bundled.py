"""Traces shipped inside the package (workloads/data), loaded by name."""

from __future__ import annotations

from importlib import resources

from workloads.formats.loaders import load_trace
from workloads.trace import Trace

# name -> file in workloads/data; sources, licenses and citations are in its README.md.
BUNDLED: dict[str, str] = {
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
    "azure-code": "AzureLLMInferenceTrace_code.csv",
    "mooncake-synthetic": "synthetic_trace.jsonl",  # Poisson arrivals, real lengths/prefixes
}


def load_bundled(name: str) -> Trace:
    """Load a bundled trace by name (see BUNDLED)."""
    if name not in BUNDLED:
        raise ValueError(f"unknown bundled trace {name!r} (known: {', '.join(BUNDLED)})")
    resource = resources.files("workloads.data") / BUNDLED[name]
    with resources.as_file(resource) as path:
        return load_trace(path, name=name)
