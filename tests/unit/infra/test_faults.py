"""Parsing of `governor demo --fault ...`."""

import pytest

from infra.faults import Fault, parse_fault


@pytest.mark.parametrize("text, fault", [
    ("kill:1@8", Fault("kill", 1, 8.0)),
    ("start:1@11", Fault("start", 1, 11.0)),
    ("slow:0:5@6", Fault("slow", 0, 6.0, 5.0)),
    ("stall:2:1.5@3", Fault("stall", 2, 3.0, 1.5)),
    ("restart:router@6.5", Fault("restart", -1, 6.5, component="router")),
])
def test_each_kind_parses_and_prints_back(text: str, fault: Fault) -> None:
    assert parse_fault(text) == fault
    assert str(fault) == {"slow:0:5@6": "slow:0@6", "stall:2:1.5@3": "stall:2@3"}.get(text, text)


@pytest.mark.parametrize("text", ["restart:worker@3", "kill:x@1", "slow:0:0@2", "kill:1"])
def test_bad_faults_are_refused_with_the_forms_expected(text: str) -> None:
    with pytest.raises(ValueError, match="restart:router@S|must be positive"):
        parse_fault(text)
