"""A worker whose vLLM server does not answer yet says that it waits, at the default log level
(WARNING): README promises it says so every 30 s of its 600 s wait."""
import asyncio
import logging
import socket

import pytest

from schemas.errors import TerminalError
from workers.vllm_engine import VllmHttpEngine


def test_the_wait_for_a_server_is_said_at_the_default_log_level(caplog) -> None:
    """Before, it was logged at INFO: a worker (or `governor up --vllm-url` of a server not
    started yet) printed nothing for up to ten minutes, its log empty, its `up` table empty."""
    with socket.socket() as bound:  # a port nothing listens on (connections refused)
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        engine = VllmHttpEngine(f"http://127.0.0.1:{port}", connect_timeout_s=0.5)

        async def start() -> None:
            try:
                await engine.start()
            finally:
                await engine.close()

        with caplog.at_level(logging.WARNING):
            with pytest.raises(TerminalError, match="no vLLM server answers"):
                asyncio.run(start())
    said = [record for record in caplog.records if "waiting for the vLLM server" in
            record.getMessage()]
    assert said, caplog.text
    assert said[0].levelno == logging.WARNING
    assert f"http://127.0.0.1:{port}" in said[0].getMessage()
