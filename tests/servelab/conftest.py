"""Fixtures: the tiny model (loaded once) and a shared tiny-model server per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from executor.backend import load_model
from servelab.serve.server import ServerThread
from tests.servelab.serve.helpers import MODEL, start_server


@pytest.fixture(scope="session")
def tiny_model():
    return load_model(MODEL)


@pytest.fixture(scope="module")
def server(tiny_model) -> Iterator[ServerThread]:
    """One shared server per test module (tests leave it idle and healthy)."""
    with start_server(tiny_model) as running:
        yield running
