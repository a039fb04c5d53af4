"""Tests of streams.worker.ChangelogsNotFoundYet: a fresh streams worker's changelogs, missing
from the broker's metadata until Faust creates them, are no ERROR; other topics' still are."""

import inspect
import logging

import aiokafka.cluster
import pytest

from streams.worker import TOPIC_NOT_FOUND, ChangelogsNotFoundYet

CHANGELOG = "governor.streams-windows-changelog"


def _not_found(topic: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("aiokafka.cluster", level, __file__, 1, TOPIC_NOT_FOUND, (topic,),
                             None)


def test_the_filtered_message_is_aiokafkas_own() -> None:
    assert f'log.error("{TOPIC_NOT_FOUND}", topic)' in inspect.getsource(aiokafka.cluster)


@pytest.mark.parametrize(("level", "shown"), [(logging.WARNING, False), (logging.ERROR, False),
                                               (logging.INFO, True), (logging.DEBUG, True)])
def test_a_changelog_not_found_yet_is_info(level: int, shown: bool) -> None:
    record = _not_found(CHANGELOG)
    assert ChangelogsNotFoundYet([CHANGELOG], level).filter(record) is shown
    assert (record.levelno, record.levelname) == (logging.INFO, "INFO")


@pytest.mark.parametrize("record", [
    _not_found("governor.requests"),  # a topic of the catalog: a real error
    logging.LogRecord("aiokafka.cluster", logging.ERROR, __file__, 1,
                      "Topic %s is not authorized for this client", (CHANGELOG,), None),
])
def test_other_errors_stay_errors(record: logging.LogRecord) -> None:
    assert ChangelogsNotFoundYet([CHANGELOG], logging.WARNING).filter(record) is True
    assert (record.levelno, record.levelname) == (logging.ERROR, "ERROR")
