"""A one-shot send of the command line whose broker is gone before it starts: an error naming
the broker and what was not sent. Before 7 Dec it ended in a traceback (aiokafka's
``KafkaConnectionError``, exit 1) where the broker went away after the command's checks."""

import asyncio

import pytest

from infra.delivery import NotAcknowledged, send_once
from infra.kafka import free_ports
from schemas.commands import DrainWorker


def test_a_send_whose_broker_is_gone_before_it_starts_is_an_error_saying_so():
    bootstrap = f"127.0.0.1:{free_ports(1)[0]}"  # (nothing listens there)
    command = DrainWorker(event_time_ms=1, command_id="drain-worker-0", issued_by="operator",
                          reason="", worker_id="worker-0")
    with pytest.raises(NotAcknowledged) as raised:
        asyncio.run(send_once(bootstrap, [("t.control", command, "worker-0", None)],
                              "the command drain-worker-0"))
    assert str(raised.value).startswith(f"the broker at {bootstrap} could not be reached: the "
                                        "command drain-worker-0 was not sent (")
