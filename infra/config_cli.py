"""``governor config get|set``: read and change live settings through ``governor.config``."""

import asyncio
import json
import logging
from collections.abc import Awaitable
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from controllers.live_config import LiveConfig
from controllers.router.core import RouterCore
from infra.bus import CONFIG_PARTITION, ConfigPartition, now_ms
from infra.delivery import send_once
from schemas.codec import DecodeError, decode
from schemas.config import ConfigSet, GovernorConfig
from schemas.errors import TerminalError, one_line
from schemas.topics import TopicCatalog
from workers.sim import models


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


#: How much of a value refused ``governor config set`` echoes (a map of 1,000 tenants was
#: echoed whole before its errors).
SHOWN_CHARS = 80


def _shown(value: Any) -> str:
    """``value`` as JSON, cut after ``SHOWN_CHARS``."""
    text = json.dumps(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."


def _as_the_router_applies(config: GovernorConfig) -> LiveConfig:
    """Changes checked as the router checks them (an unknown scorer name is refused too), so the
    CLI refuses what the router would and shows the configuration the router has."""
    return LiveConfig("governor-config-cli", config, check=RouterCore(config).apply_config)


async def current_config(bootstrap: str, catalog: TopicCatalog, *,
                         refuse: bool = True) -> GovernorConfig:
    """The configuration in force: every record of the config topic applied in order (the
    topic must exist: reading creates nothing, so a misspelt namespace is not taken for a new
    one with the defaults in force). A ``ConfigTopicSplit`` where the topic has more than one
    partition; ``refuse=False``: its first partition's, as the running components read it."""
    return (await _read_config(bootstrap, catalog, refuse=refuse))[0].config


async def declare_models(read: Awaitable[GovernorConfig], within_s: float, unknown: set[str],
                         who: str, log: logging.Logger) -> None:
    """Declare the models of the configuration ``read`` gives (``current_config``), waiting for
    it at most ``within_s``: a worker and the supervisor read them for commands naming models
    in ``unknown`` (``models.DeclaredReads``), and neither may be held long. A read that fails
    or takes longer (the broker away or silent, a declaration this process refuses) is logged on
    ``log`` as ``who``'s and leaves ``unknown`` unknown."""
    try:
        models.configure_models((await asyncio.wait_for(read, within_s)).models)
    except (TimeoutError, KafkaError, ValueError) as exc:
        log.warning("%s could not read the models the configuration declares (for %s): %s",
                    who, ", ".join(sorted(unknown)), str(exc) or type(exc).__name__)


async def _read_config(bootstrap: str, catalog: TopicCatalog, *,
                       refuse: bool = True) -> tuple[LiveConfig, int]:
    """Every record of the config topic's partition applied in order, and the offset after the
    last (``ConfigPartition``)."""
    reader = await ConfigPartition.start(bootstrap, catalog, "governor config", refuse=refuse)
    consumer, partition = reader.consumer, TopicPartition(catalog.config, CONFIG_PARTITION)
    try:
        end = (await consumer.end_offsets([partition]))[partition]
        live = _as_the_router_applies(GovernorConfig())
        spec = catalog.spec(catalog.config)
        while await consumer.position(partition) < end:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    try:
                        message = decode(spec, record.value)
                    except DecodeError:
                        continue
                    if isinstance(message, ConfigSet):
                        live.apply(message, record.offset, now_ms(), record.key,
                                   written_ms=record.timestamp)
        return live, end
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
            raise TerminalError(f"rejected {key}={_shown(value)}: {verdict.reason}")
        records += live.kept_otherwise(now_ms())
    restated = len(records) - 1
    await send_once(bootstrap, [(catalog.config, record, record.key, CONFIG_PARTITION)
                                for record in records],
                    f"the change of {key}" + (f" and the {restated} setting"
                                              f"{'s' if restated != 1 else ''} restated with it"
                                              if restated else ""))
    return live.config if validate else config


def run_set(bootstrap: str, namespace: str, key: str, text: str, validate: bool) -> GovernorConfig:
    return asyncio.run(set_setting(bootstrap, TopicCatalog(namespace), key, parse_value(text), validate))


def run_get(bootstrap: str, namespace: str) -> GovernorConfig:
    """What the running components have in force, even where the topic has more partitions than
    its one (``governor config get`` says so: what ``governor config set`` refuses to add to)."""
    return asyncio.run(current_config(bootstrap, TopicCatalog(namespace), refuse=False))
