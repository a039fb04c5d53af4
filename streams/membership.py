"""Whether a streams worker may still speak for its partitions: its group membership confirmed.

A streams worker publishes the signals of the partitions assigned to it. Paused (SIGSTOP, a VM
frozen, a loop blocked) past its session timeout, it is dropped from its group and the others
take its partitions; resumed, it still holds its old assignment until its next heartbeat is
refused and it rejoins. Its publishing timer, due since long before, ran first: it published
the fleet view of the partitions it had lost as they were before the pause, over the newer one
their new owner had published (``tests/integration/test_streams_paused.py``: 7 to 9 workers'
``last_seen_ms`` went back 6 s, in 3 runs of 4).

The broker keeps a member for ``session_timeout_s`` after each heartbeat it accepts, and takes
no partition from it meanwhile without a rebalance that the member joins first. So a heartbeat
acknowledged proves the membership until ``session_timeout_s`` after it was *sent* (the broker
received it later): ``Membership`` keeps that time, and the publisher holds while it has
passed. What the broker acknowledged is read from the group coordinator of the aiokafka
consumer in Faust's consumer thread (``watch_heartbeats``).
"""

import time
from collections.abc import Callable


class Membership:
    """Until when the group has confirmed this worker (monotonic seconds). Pure."""

    def __init__(self, session_timeout_s: float) -> None:
        if session_timeout_s <= 0:
            raise ValueError(f"session_timeout_s must be positive, not {session_timeout_s}")
        self.session_timeout_s = session_timeout_s
        self.confirmed_until: float | None = None  # none acknowledged yet

    def acknowledged(self, sent_s: float) -> None:
        """The broker accepted a heartbeat sent at ``sent_s``."""
        until = sent_s + self.session_timeout_s
        if self.confirmed_until is None or until > self.confirmed_until:
            self.confirmed_until = until

    def confirmed(self, now_s: float) -> bool:
        """Whether no other member can have been given this one's partitions by ``now_s``."""
        return self.confirmed_until is not None and now_s < self.confirmed_until


def watch_heartbeats(coordinator, membership: Membership,
                     clock: Callable[[], float] = time.monotonic) -> None:
    """Tell ``membership`` of each heartbeat that aiokafka's group ``coordinator`` has
    acknowledged (``GroupCoordinator._do_heartbeat`` returns True: accepted, or accepted while
    the group rebalances, which it joins before any other member takes its partitions). Once
    per coordinator; it runs in the consumer's thread, and writes one float."""
    if getattr(coordinator, "_governor_membership", None) is membership:
        return
    heartbeat = coordinator._do_heartbeat

    async def watched() -> bool:
        sent_s = clock()
        accepted = await heartbeat()
        if accepted:
            membership.acknowledged(sent_s)
        return accepted

    coordinator._do_heartbeat = watched
    coordinator._governor_membership = membership
