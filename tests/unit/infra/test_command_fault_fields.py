"""``governor command inject_fault``: the fields a fault uses, and no other (a field the
worker ignores was sent, and the fault did not do what it said)."""

import pytest

from infra.command_cli import operator_command
from schemas.commands import InjectFault
from schemas.errors import TerminalError

NOW = 1_700_000_000_000


def _fault(fields: str) -> InjectFault:
    return operator_command("inject_fault", fields, reason="", issued_by="operator", now_ms=NOW)


@pytest.mark.parametrize("fields, error", [
    # the worker slows down until told another factor: a duration was ignored
    ('{"worker_id": "w", "fault": "slow", "factor": 4, "duration_s": 30}',
     "inject_fault.duration_s: a slow fault does not use it (it lasts until the worker's next "
     "slow fault; factor 1 ends it)"),
    ('{"worker_id": "w", "fault": "slow"}',  # (factor 1: nothing slows)
     "inject_fault.factor: a slow fault needs it (it lasts until the worker's next slow fault; "
     "factor 1 ends it)"),
    ('{"worker_id": "w", "fault": "stall"}',
     "inject_fault.duration_s: a stall fault needs it (it lasts duration_s)"),
    ('{"worker_id": "w", "fault": "stall", "duration_s": 0}',
     "inject_fault.duration_s: a stall of 0 s does nothing; give more than 0 s, up to 86,400 s"),
    ('{"worker_id": "w", "fault": "stall", "duration_s": 5, "factor": 2}',
     "inject_fault.factor: a stall fault does not use it (it lasts duration_s)"),
    ('{"worker_id": "w", "fault": "crash", "duration_s": 5}',
     "inject_fault.duration_s: a crash fault does not use it (the worker is killed at once)"),
])
def test_a_field_the_fault_ignores_or_needs_is_an_error_naming_it(fields: str, error: str):
    with pytest.raises(TerminalError) as raised:
        _fault(fields)
    assert str(raised.value) == error


def test_each_fault_with_its_own_fields_is_sent():
    assert _fault('{"worker_id": "w", "fault": "slow", "factor": 4}').factor == 4
    assert _fault('{"worker_id": "w", "fault": "slow", "factor": 1}').factor == 1  # (ends it)
    assert _fault('{"worker_id": "w", "fault": "stall", "duration_s": 30}').duration_s == 30
    assert _fault('{"worker_id": "w", "fault": "crash"}').fault == "crash"
