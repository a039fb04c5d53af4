"""A streams worker's membership: confirmed for the session timeout after the heartbeat the
broker acknowledged was sent, and only by those it acknowledged."""

import asyncio

import pytest

from streams.membership import Membership, watch_heartbeats


def test_a_heartbeat_confirms_the_membership_for_a_session_timeout_from_its_sending():
    membership = Membership(6.0)
    assert not membership.confirmed(0.0)  # none acknowledged yet
    membership.acknowledged(10.0)
    assert membership.confirmed(10.5) and membership.confirmed(15.99)
    assert not membership.confirmed(16.0)  # the broker may have dropped it since
    membership.acknowledged(9.0)  # an older one's answer read late moves nothing back
    assert membership.confirmed(15.5)


def test_the_session_timeout_must_be_positive():
    with pytest.raises(ValueError, match="session_timeout_s must be positive, not 0"):
        Membership(0)


class Coordinator:
    """aiokafka's ``GroupCoordinator``, as far as ``watch_heartbeats`` uses it."""

    def __init__(self, answers: list[bool]) -> None:
        self.answers = answers

    async def _do_heartbeat(self) -> bool:
        return self.answers.pop(0)


def test_only_the_heartbeats_the_broker_accepted_confirm_it():
    membership, clock = Membership(6.0), iter([100.0, 200.0, 300.0])
    coordinator = Coordinator([True, False, True])
    watch_heartbeats(coordinator, membership, clock=lambda: next(clock))
    watch_heartbeats(coordinator, membership)  # once per coordinator
    assert asyncio.run(coordinator._do_heartbeat()) is True
    assert membership.confirmed_until == 106.0
    assert asyncio.run(coordinator._do_heartbeat()) is False  # refused: the member is unknown
    assert membership.confirmed_until == 106.0
    assert asyncio.run(coordinator._do_heartbeat()) is True
    assert membership.confirmed_until == 306.0
