"""Governor's embedded Apache Kafka: download the jars with Maven, run one KRaft node on the JVM.

Typical use::

    from infra.kafka import BrokerSettings, EmbeddedKafka

    kafka = EmbeddedKafka(BrokerSettings(port=19092, controller_port=19093))
    bootstrap = kafka.start()      # downloads Kafka the first time, returns "127.0.0.1:19092"
    ...
    kafka.stop()
"""

from schemas.errors import TerminalError


class BrokerError(TerminalError):
    """The embedded broker cannot be installed, started or reached; the message says what to fix."""


# Imported after BrokerError: the submodules import it from this package.
from infra.kafka.provision import KAFKA_VERSION, cache_root, install_kafka, require_java  # noqa: E402
from infra.kafka.broker import (  # noqa: E402
    BrokerSettings,
    BrokerStatus,
    EmbeddedKafka,
    free_ports,
    new_cluster_id,
    render_server_properties,
    running_ports,
    wait_until_answers,
)

__all__ = [
    "KAFKA_VERSION",
    "BrokerError",
    "BrokerSettings",
    "BrokerStatus",
    "EmbeddedKafka",
    "cache_root",
    "free_ports",
    "install_kafka",
    "new_cluster_id",
    "render_server_properties",
    "require_java",
    "running_ports",
    "wait_until_answers",
]
