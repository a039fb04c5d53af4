"""Which process owns what ``governor up`` and ``demo`` start, so that the next one can tell
what a killed one left running.

Killed outright (SIGKILL, an out-of-memory kill, its machine session ended) ``up`` runs no
handler: the embedded broker it started runs on in a session of its own, and its components
stop by themselves (``infra.supervised``), but not at once. Each of them is recorded with its
owner (the broker's ``owner.json``, the stack's ``stack.json``), and a later ``up`` that finds
the owner gone takes over: it stops the broker as it exits, and waits for the components
before it starts its own.

A process is named by its pid and its start time: after a crash or a reboot a pid alone may
be another process's."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def started_at(pid: int) -> str | None:
    """When ``pid`` started (as the system tells it, to tell it from a later process under the
    same pid); None where it does not run, or is a zombie (exited, not reaped yet)."""
    if Path("/proc/self").is_dir():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        # (after the command: the state, field 3, then the start time, field 22, in ticks)
        return None if fields[0] == "Z" else fields[19]
    said = subprocess.run(["ps", "-o", "stat=,lstart=", "-p", str(pid)], capture_output=True,
                          text=True).stdout.split(None, 1)
    return None if len(said) < 2 or said[0].startswith("Z") else said[1].strip()


@dataclass(frozen=True)
class Owned:
    """A process, and the command it runs (``governor up``), as an owner file names it."""

    pid: int
    started: str
    command: str = ""

    @classmethod
    def this(cls, command: str = "") -> Owned:
        """This process."""
        return cls(os.getpid(), started_at(os.getpid()) or "", command)

    @classmethod
    def of(cls, pid: int, command: str = "") -> Owned | None:
        """The process ``pid`` runs now (None: none runs)."""
        started = started_at(pid)
        return None if started is None else cls(pid, started, command)

    def alive(self) -> bool:
        """Whether the process runs still (not another under its pid since)."""
        return started_at(self.pid) == self.started

    def as_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "started": self.started, "command": self.command}

    @classmethod
    def from_json(cls, value: Any) -> Owned | None:
        """The process ``as_json`` wrote (None: not one, as a file cut short or edited gives)."""
        if not isinstance(value, dict):
            return None
        pid, started, command = value.get("pid"), value.get("started"), value.get("command", "")
        if type(pid) is not int or pid <= 0 or not isinstance(started, str) \
                or not isinstance(command, str):
            return None
        return cls(pid, started, command)

    def __str__(self) -> str:
        return f"{self.command or 'a process'} (pid {self.pid})"


def write_atomically(path: Path, value: Any) -> None:
    """Write ``value`` as JSON to ``path`` whole or not at all: a process killed as it writes
    leaves the file as it was, never cut short (another process's file of its own beside it)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(value) + "\n")
    os.replace(partial, path)


def read_json(path: Path) -> Any:
    """What ``write_atomically`` wrote at ``path``; None where there is no such file, or it
    holds no JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
