"""Waiting for a broker at a port where something else listens (a web server, a broker's
controller port: a wrong `--bootstrap` or `--broker-port`)."""

import asyncio
import logging

import pytest

from infra.kafka import BrokerError, wait_until_answers


async def _wait_at_a_service_that_is_no_broker() -> tuple:
    async def hang_up(reader, writer) -> None:  # (takes the connection, answers nothing)
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(BrokerError) as raised:
            await wait_until_answers(f"127.0.0.1:{port}", timeout_s=0.5)
        return str(raised.value), port
    finally:
        server.close()
        await server.wait_closed()


def test_a_port_that_speaks_no_kafka_is_named_so_without_aiokafkas_errors(caplog):
    """Before 7 Dec each probe logged `ERROR aiokafka: Unable connect to "127.0.0.1:P": ` (an
    empty reason) before the error, which said only that no broker answers, as for a broker
    still starting."""
    with caplog.at_level(logging.WARNING):
        error, port = asyncio.run(_wait_at_a_service_that_is_no_broker())
    assert error == (f"no Kafka broker answers at 127.0.0.1:{port} within 0.5s: something there "
                     "takes connections but does not answer as a Kafka broker (another service "
                     "on that port?)")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("aiokafka")] == []
    assert logging.getLogger("aiokafka").filters == []  # (the probe's filter taken back)
