"""What one message queued to a deleted topic costs a producer, with and without
``infra.bus.forget_topic``.

    python -m benchmarks.deleted_topic [--forget-after-s 1]

Starts a broker of its own that creates no topics on use (as managed clusters are often set up),
sends one message to a topic so that the producer learns its leader, deletes the topic, and
sends one more. aiokafka retries that message until its request timeout (15 s), asking the
broker for metadata in a loop while the topic has no leader. Prints the metadata requests the
producer sent until the message's send failed, and when: once as aiokafka leaves it, once with
the topic forgotten (its message marked expired) after ``--forget-after-s``, as the outbox does
once it knows the topic is gone.
"""

import argparse
import asyncio
import logging
import tempfile
import time
from pathlib import Path

from infra.bus import create_topic, delete_topics, forget_topic, make_producer
from infra.kafka import BrokerSettings, EmbeddedKafka, free_ports


class _Requests(logging.Handler):
    """Counts the metadata requests aiokafka logs (at DEBUG)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Sending metadata request"):
            self.count += 1


async def one_run(bootstrap: str, topic: str, timeout_s: float,
                  forget_after_s: float | None) -> tuple[int, float, str]:
    """(metadata requests until the send ended, seconds until then, how it ended)."""
    await create_topic(bootstrap, topic)
    producer = make_producer(bootstrap)
    await producer.start()
    requests = _Requests()
    log = logging.getLogger("aiokafka")
    try:
        await (await producer.send(topic, b"learn the leader"))
        await delete_topics(bootstrap, [topic])
        await asyncio.sleep(1.0)  # the broker has dropped it
        log.addHandler(requests)
        start = time.monotonic()
        ack = await producer.send(topic, b"to a deleted topic")
        if forget_after_s is not None:
            await asyncio.sleep(forget_after_s)
            forget_topic(producer, topic)
        try:
            await asyncio.wait_for(ack, timeout=timeout_s)
            error = "delivered"
        except Exception as exc:  # noqa: BLE001 - the error is the figure
            error = type(exc).__name__
        return requests.count, time.monotonic() - start, error
    finally:
        log.removeHandler(requests)
        await producer.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forget-after-s", type=float, default=1.0,
                    help="when the second run forgets the topic (1)")
    args = ap.parse_args()
    log = logging.getLogger("aiokafka")
    log.setLevel(logging.DEBUG)
    log.propagate = False  # counted, not printed
    log.addHandler(logging.NullHandler())
    with tempfile.TemporaryDirectory() as home:
        port, controller_port = free_ports(2)
        kafka = EmbeddedKafka(BrokerSettings(port=port, controller_port=controller_port,
                                             home=Path(home), auto_create_topics=False))
        print("starting a broker that creates no topics on use ...", flush=True)
        bootstrap = kafka.start(timeout_s=120)
        try:
            for label, forget in (("as aiokafka leaves it", None),
                                  (f"forgotten after {args.forget_after_s:g} s",
                                   args.forget_after_s)):
                count, ended_s, error = asyncio.run(one_run(
                    bootstrap, f"deleted-{int(time.time() * 1000)}", 60.0, forget))
                print(f"{label:28} {count:>7,} metadata requests until the send ended, after "
                      f"{ended_s:.1f} s ({error})", flush=True)
        finally:
            kafka.stop()


if __name__ == "__main__":
    main()
