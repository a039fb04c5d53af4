"""The watch of a component's supervisor (``infra.supervised``) where it has none to watch."""

import asyncio

import pytest

from infra.supervised import SUPERVISOR_PID_ENV, stop_when_unsupervised


@pytest.mark.parametrize("value", [None, "", "up", "-1", "١٢٣", "²"])
def test_a_component_with_no_supervisors_pid_is_not_watched(monkeypatch, value):
    """Started by hand (no variable) or with one that names no pid: the watch returns at once,
    sending nothing. (Digits of other scripts passed ``isdigit``: ``int`` read "١٢٣" as a pid
    that was never the parent, and the component stopped itself at once; "²" failed the watch.)"""
    if value is None:
        monkeypatch.delenv(SUPERVISOR_PID_ENV, raising=False)
    else:
        monkeypatch.setenv(SUPERVISOR_PID_ENV, value)
    asyncio.run(asyncio.wait_for(stop_when_unsupervised(watch_s=0.01), 5))
