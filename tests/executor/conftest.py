"""Shared fixtures for executor tests: the tiny random model, on each kernel path.

`kernel_path` runs a test once with servelab's native CPU kernels (skipped where they did not
build) and once on the torch path (oneDNN linears, batched-matmul attention): both must keep
every guarantee the tests check. A model follows the path it was built (packed) under.
"""

from __future__ import annotations

import contextlib

import pytest

from executor import native
from executor.model import Transformer
from executor.weights import random_model
from tests.executor.helpers import TINY


@pytest.fixture(scope="session", params=["native", "torch"])
def kernel_path(request):
    """A context manager to build models in for this path."""
    if request.param == "torch":
        return native.disabled
    if not native.enabled():
        pytest.skip("servelab's native CPU kernels are not available on this machine")
    return contextlib.nullcontext


@pytest.fixture(scope="session")
def tiny_model(kernel_path) -> Transformer:
    with kernel_path():
        return random_model(TINY, seed=0)
