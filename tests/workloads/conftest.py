"""Shared fixtures: the bundled traces (loaded once) and a small file writer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from workloads import Trace, load_bundled


@pytest.fixture(scope="session")
def conv_trace() -> Trace:
    return load_bundled("azure-conv")


@pytest.fixture(scope="session")
def code_trace() -> Trace:
    return load_bundled("azure-code")


@pytest.fixture(scope="session")
def mooncake_trace() -> Trace:
    return load_bundled("mooncake-synthetic")


@pytest.fixture
def write_file(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write `text` (exactly, no newline added) to tmp_path/name and return the path."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write
