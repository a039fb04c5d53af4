"""``governor config get|set``: read and change live settings through ``governor.config``."""

import asyncio
import json
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from controllers.live_config import LiveConfig
from controllers.router.core import RouterCore
from infra.bus import Outbox, make_producer, now_ms
from schemas.codec import DecodeError, decode
from schemas.config import ConfigSet, GovernorConfig
from schemas.errors import TerminalError, one_line
from schemas.topics import TopicCatalog


def parse_value(text: str, key: str = "") -> Any:
    """A JSON value (number, true, {"a": 1}, ...); anything else is taken as a string, but for
    one nested deeper than the parser goes (a ``TerminalError`` naming ``key``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
    except RecursionError:  # (no JSONDecodeError: the parser gave up)
        raise TerminalError(f"config set {key[:40]}: VALUE is nested too deep to parse as "
                            "JSON") from None


def config_change(key: str, value: Any) -> ConfigSet:
    """The ``ConfigSet`` that sets ``key`` to ``value``; a malformed key is a ``TerminalError``."""
    try:
        return ConfigSet(event_time_ms=now_ms(), key=key, value=value)
    except ValidationError as exc:
        raise TerminalError(f"config set {key[:40]!r}{'...' if len(key) > 40 else ''}: "
                            f"{one_line(exc)}") from None


def _as_the_router_applies(config: GovernorConfig) -> LiveConfig:
    """Changes checked as the router checks them (an unknown scorer name is refused too), so the
    CLI refuses what the router would and shows the configuration the router has."""
    return LiveConfig("governor-config-cli", config, check=RouterCore(config).apply_config)


async def current_config(bootstrap: str, catalog: TopicCatalog) -> GovernorConfig:
    """The configuration in force: every record of the config topic applied in order (the
    topic must exist: reading creates nothing, so a misspelt namespace is not taken for a new
    one with the defaults in force)."""
    return (await _read_config(bootstrap, catalog))[0].config


async def _read_config(bootstrap: str, catalog: TopicCatalog) -> tuple[LiveConfig, int]:
    """Every record of the config topic applied in order, and the offset after the last."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(catalog.config, p)
                      for p in consumer.partitions_for_topic(catalog.config) or {0}]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        end = await consumer.end_offsets(partitions)
        live = _as_the_router_applies(GovernorConfig())
        spec = catalog.spec(catalog.config)
        while any([await consumer.position(tp) < end[tp] for tp in partitions]):
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    try:
                        message = decode(spec, record.value)
                    except DecodeError:
                        continue
                    if isinstance(message, ConfigSet):
                        live.apply(message, record.offset, now_ms(), record.key,
                                   written_ms=record.timestamp)
        return live, max(end.values(), default=0)
    finally:
        await consumer.stop()


async def set_setting(bootstrap: str, catalog: TopicCatalog, key: str, value: Any,
                      validate: bool = True) -> GovernorConfig:
    """Validate the change against the configuration in force, then produce it, and after it
    the value in force of each setting that the topic, once compacted, would not give
    (``LiveConfig.kept_otherwise``: one that held only after a record the change supersedes)."""
    change = config_change(key, value)
    live, end = await _read_config(bootstrap, catalog)
    change = live.after_superseded(change)  # (this clock behind the last change's)
    config, records = live.config, [change]
    if validate:
        verdict = live.apply(change, end, now_ms(), key.encode(), asked=True)
        if verdict.type == "config_rejected":
            raise TerminalError(f"rejected {key}={json.dumps(value)}: {verdict.reason}")
        records += live.kept_otherwise(now_ms())
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        outbox = Outbox(producer)
        for record in records:
            outbox.emit(catalog.config, record, record.key)
        await outbox.flush()
    finally:
        await producer.stop()
    return live.config if validate else config


def run_set(bootstrap: str, namespace: str, key: str, text: str, validate: bool) -> GovernorConfig:
    return asyncio.run(set_setting(bootstrap, TopicCatalog(namespace), key, parse_value(text), validate))


def run_get(bootstrap: str, namespace: str) -> GovernorConfig:
    return asyncio.run(current_config(bootstrap, TopicCatalog(namespace)))
