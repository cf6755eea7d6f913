"""Shared fixtures for executor tests: the tiny random model."""

from __future__ import annotations

import pytest

from executor.model import Transformer
from executor.weights import random_model
from tests.executor.helpers import TINY


@pytest.fixture(scope="session")
def tiny_model() -> Transformer:
    return random_model(TINY, seed=0)
