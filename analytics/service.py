"""``governor sink``: the sink and its SQL endpoint in one process, until told to stop."""

import asyncio
import logging
from dataclasses import asdict
from pathlib import Path

from prometheus_client import CollectorRegistry

from analytics.endpoint import SqlEndpoint
from analytics.metrics import sink_registry
from analytics.sink import AnalyticsSink, SinkSettings
from analytics.store import StoreLocation
from infra.bus import create_topics
from infra.runtime import tune_gc
from infra.serving import say_doing, say_serving
from schemas.errors import TerminalError
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)


class SinkService:
    """The sink, plus (unless ``sql_port`` is None) its read-only SQL endpoint on 127.0.0.1.

    ``data_dir`` holds the embedded store (``chdb/``) and ``sql-endpoint.json``, which tells
    ``governor sql`` where the endpoint listens; in server mode only the latter.
    """

    def __init__(self, bootstrap: str, namespace: str, data_dir: Path,
                 clickhouse_url: str | None = None, sql_port: int | None = 8124,
                 settings: SinkSettings = SinkSettings(),
                 registry: CollectorRegistry | None = None) -> None:
        """``registry``: where its Prometheus metrics go (``analytics.metrics``)."""
        self.catalog = TopicCatalog(namespace)
        self.data_dir = data_dir
        self.location = StoreLocation.for_namespace(namespace, data_dir, clickhouse_url)
        self.sink = AnalyticsSink(bootstrap, self.catalog, self.location, settings)
        if registry is not None:
            sink_registry(lambda: self.sink.stats, registry)
        self.bootstrap = bootstrap
        self.sql_port = sql_port

    async def run(self, stop: asyncio.Event) -> None:
        await create_topics(self.bootstrap, self.catalog)
        endpoint = None
        if self.sql_port is not None:
            endpoint = SqlEndpoint(self.location, port=self.sql_port, health=lambda: {
                "ready": self.sink.ready.is_set(), **asdict(self.sink.stats)})
            try:
                await endpoint.start()
            except OSError as exc:
                raise TerminalError(f"the SQL endpoint cannot listen on 127.0.0.1:{self.sql_port}: "
                                    f"{exc.strerror or exc}; pass --sql-port 0 (any free port), "
                                    "another port, or --no-sql") from None
            if not await asyncio.to_thread(endpoint.write_discovery_file, self.data_dir):
                logger.warning("a sink already announces its SQL endpoint in %s; this one "
                               "does not", self.data_dir)
        if self.location.url is not None:  # (the embedded engine opens at once)
            say_doing("sink", f"connecting to {self.location.named()}")
        running = asyncio.ensure_future(self.sink.run(stop))
        try:
            if await self._opened(running):
                say_serving("sink", f"namespace {self.catalog.namespace}", self.bootstrap,
                            f"into {self.location.describe()}"
                            + (f"; SQL at {endpoint.url}" if endpoint is not None else ""))
                tune_gc()  # this process is the sink's: started, it now decodes batch after batch
            await running
        except BaseException:
            running.cancel()  # (this run cancelled: the sink's with it)
            raise
        finally:
            if endpoint is not None:
                endpoint.remove_discovery_file(self.data_dir)
                await endpoint.stop()

    async def _opened(self, running: asyncio.Future) -> bool:
        """Wait until the sink has opened its store (``sink.ready``), or ``running`` ended first
        (stopped while it waited; failed): whether it opened. Until then its retries say that it
        waits for the store and why (a server's first open after ``sink: connecting to ...``,
        which ``run`` says at once); before 7 Dec it said ``serving ... (into URL ...)`` at
        once, however long it waited."""
        opened = asyncio.ensure_future(self.sink.ready.wait())
        try:
            await asyncio.wait({opened, running}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            opened.cancel()
        return self.sink.ready.is_set()
