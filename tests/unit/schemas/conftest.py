"""Fixtures of the schema tests; the examples themselves live in schema_examples.py."""

from __future__ import annotations

import pytest

from schema_examples import EXAMPLES
from schemas.base import Message


@pytest.fixture(scope="session")
def examples() -> dict[type[Message], Message]:
    """One valid instance of every message model, keyed by model."""
    return EXAMPLES

