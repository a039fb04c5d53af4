"""Tests of infra.wording.counted: a count of one says its noun singular."""

import pytest

from infra.wording import counted


@pytest.mark.parametrize(("count", "noun", "plural", "said"), [
    (1, "worker", None, "1 worker"),
    (2, "worker", None, "2 workers"),
    (0, "request", None, "0 requests"),
    (1024, "request", None, "1,024 requests"),
    (1, "GPU", None, "1 GPU"),
    (3, "entry", "entries", "3 entries"),
])
def test_a_count_of_one_is_singular(count: int, noun: str, plural: str | None, said: str) -> None:
    assert counted(count, noun, plural) == said
