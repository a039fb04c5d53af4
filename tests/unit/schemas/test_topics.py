"""Tests of schemas.topics: the catalog's names, specs and Kafka settings."""

from __future__ import annotations

from collections import Counter

import pytest

from schemas.base import Message
from schemas.topics import SPECS, TopicCatalog, TopicSpec, all_models

SUFFIXES = ["requests", "dispatch", "responses", "telemetry", "kv", "signals", "control", "config",
            "deadletter"]


def test_catalog_has_the_documented_topics() -> None:
    assert [spec.suffix for spec in SPECS] == SUFFIXES


@pytest.mark.parametrize("namespace", ["governor", "test-run_1", "a", "ns.with.dots", "X" * 200])
def test_names_are_namespace_dot_suffix(namespace: str) -> None:
    catalog = TopicCatalog(namespace)
    assert catalog.namespace == namespace
    assert set(catalog.topics()) == {f"{namespace}.{s}" for s in SUFFIXES}
    for suffix in SUFFIXES:
        name = getattr(catalog, suffix)
        assert name == catalog.name(suffix) == f"{namespace}.{suffix}"
        assert catalog.spec(name).suffix == suffix
        assert len(name) <= 249  # Kafka's limit on topic names


def test_default_namespace_is_governor() -> None:
    assert TopicCatalog().requests == "governor.requests"


@pytest.mark.parametrize(
    "namespace",
    ["", "has space", "slash/no", "X" * 201, "semi;colon", "tab\t", "governör", "ns²", "ｎｓ"],
)
def test_bad_namespace_is_rejected(namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        TopicCatalog(namespace)


@pytest.mark.parametrize("topic", ["governor.nope", "other.requests", "requests", "", "governor."])
def test_spec_of_an_unknown_topic_raises_key_error(topic: str) -> None:
    with pytest.raises(KeyError, match="not a topic of namespace 'governor'"):
        TopicCatalog().spec(topic)


def test_topics_returns_a_copy() -> None:
    catalog = TopicCatalog()
    catalog.topics().clear()
    assert len(catalog.topics()) == len(SPECS)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.suffix)
def test_each_spec_is_well_formed(spec: TopicSpec) -> None:
    assert spec.types, f"{spec.suffix} carries no type"
    assert len(spec.types) == len(spec.models), "two models of one topic share a type"
    assert spec.partitions >= 1
    assert spec.key
    assert spec.doc
    assert all(issubclass(m, Message) for m in spec.models)
    config = spec.config()
    assert config["cleanup.policy"] == spec.cleanup
    if spec.retention_ms is None:
        assert "retention.ms" not in config
    else:
        assert int(config["retention.ms"]) == spec.retention_ms > 0


def test_type_literals_are_unique_across_all_models() -> None:
    types = Counter(m.model_fields["type"].default for m in all_models())
    assert [t for t, n in types.items() if n > 1] == []
    for model in all_models():  # the literal and the default agree
        assert {model.model_fields["type"].default} == TopicSpec("x", "k", (model,), 1).types


def test_config_topic_is_compacted_without_retention() -> None:
    spec = TopicCatalog().spec("governor.config")
    assert spec.config() == {"cleanup.policy": "compact",
                             "message.timestamp.type": "LogAppendTime"}


def test_the_control_and_config_topics_are_stamped_by_the_broker() -> None:
    """Their readers judge a record's own stamp against when it was appended, the same for
    every reader (``controllers.overrides``)."""
    stamped = {spec.suffix for spec in SPECS
               if spec.config().get("message.timestamp.type") == "LogAppendTime"}
    assert stamped == {"control", "config"}


def test_other_topics_are_deleted_by_time() -> None:
    for spec in SPECS:
        if spec.suffix != "config":
            assert spec.config()["cleanup.policy"] == "delete"
            assert "retention.ms" in spec.config()


def test_dispatch_has_a_partition_per_worker_slot() -> None:
    assert TopicCatalog().spec("governor.dispatch").partitions == 32


def test_all_models_lists_each_model_once_in_catalog_order() -> None:
    models = all_models()
    assert len(models) == len(set(models))
    expected = []
    for spec in SPECS:
        expected += [m for m in spec.models if m not in expected]
    assert models == expected
    assert {m for spec in SPECS for m in spec.models} == set(models)


def test_a_dispatch_is_misplaced_off_its_slots_partition_and_nothing_else_is() -> None:
    from schemas.examples import examples
    from schemas.requests import CancelRequest, Dispatch

    catalog, found = TopicCatalog("t"), examples()
    dispatch = found[Dispatch]  # slot 3
    assert catalog.misplaced(catalog.dispatch, 3, dispatch) is None
    assert catalog.misplaced(catalog.dispatch, 7, dispatch) == (
        "slot: 3 is not the partition it was read from (7); a dispatch is written to its "
        "slot's partition")
    assert catalog.misplaced(catalog.dispatch, 7, found[CancelRequest]) is None
    assert catalog.misplaced(catalog.requests, 7, found[CancelRequest], b"req-1") is None


def test_a_request_or_cancel_is_misplaced_under_a_key_other_than_its_id() -> None:
    from schemas.examples import examples
    from schemas.requests import CancelRequest, InferenceRequest

    catalog, found = TopicCatalog("t"), examples()
    for kind in (InferenceRequest, CancelRequest):
        message = found[kind]
        rid = message.request_id
        assert catalog.misplaced(catalog.requests, 0, message, rid.encode()) is None
        assert catalog.misplaced(catalog.requests, 0, message, None) == (  # (until 6 Dec: taken)
            f"key: none; a request and its cancellation are keyed by their request_id {rid!r} "
            "(without a key each record of it may land on another partition, and be placed by "
            "another router)")
        assert catalog.misplaced(catalog.requests, 0, message, b"x") == (
            f"key: 'x' is not the request_id {rid!r}; a request and its cancellation are keyed "
            "by their request_id")
        assert catalog.misplaced(catalog.telemetry, 0, message, b"x") is None


@pytest.mark.parametrize("reply_to", [
    "ns.dispatch", "ns.control", "ns.config", "ns.telemetry",  # this namespace's own
    "other.control", "other.config", "a.b.signals", "other.responses", "other.deadletter",
    "other.streams.by-task", "other.streams-windows-changelog",
    "other.streams-__assignor-__leader", ".control",  # any namespace's, by their suffix
    "__consumer_offsets", "__transaction_state", "_schemas",  # Kafka's and its tools'
])
def test_a_reply_topic_that_is_internal_is_refused_naming_reply_to(reply_to: str) -> None:
    """Until 6 Dec only this namespace's own topics were refused: a request could have its
    chunks written into another namespace's control or config topic, or a ``__`` topic."""
    why = TopicCatalog("ns").internal_reply_topic(reply_to)
    assert why is not None and why.startswith(f"reply_to {reply_to!r} is an internal topic")


@pytest.mark.parametrize("reply_to", [None, "ns.responses", "client-7.replies", "control",
                                      "acme.control-replies", "acme.my_config", "x__y"])
def test_a_clients_own_reply_topic_is_taken(reply_to: str | None) -> None:
    assert TopicCatalog("ns").internal_reply_topic(reply_to) is None
