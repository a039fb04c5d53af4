"""The one line a long-running component prints once it serves.

At the default log level (WARNING) a healthy component logs nothing: an operator who starts a
router or a worker by hand against an existing Kafka cluster had no sign it was up. Each
(router, worker, controllers, streams, sink) prints one line to stderr once it serves,
whatever the log level: what it is, what it reads and where, e.g. ``router router-0: serving
governor.requests on 127.0.0.1:9092 (partitions [0, 1, 2, 3])``. One that may take a while
to get there says first what it waits on (``say_doing``)."""

import sys


def say_serving(component: str, what: str, bootstrap: str, detail: str = "") -> None:
    """``COMPONENT: serving WHAT on BOOTSTRAP (DETAIL)`` to stderr."""
    say_doing(component, f"serving {what} on {bootstrap}{f' ({detail})' if detail else ''}")


def say_doing(component: str, doing: str) -> None:
    """``COMPONENT: DOING`` to stderr, whatever the log level: e.g. ``sink: connecting to
    ClickHouse at URL (database D)``, before an open that may wait 10 s for a silent server."""
    print(f"{component}: {doing}", file=sys.stderr, flush=True)
