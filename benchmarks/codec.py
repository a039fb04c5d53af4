"""Codec benchmark: JSON through pydantic against msgpack, encode and decode+validate.

    python -m benchmarks.codec [--n 20000]

Prints messages/s and bytes per message for a request, a dispatch and a response chunk. The
figures chose the codec in ``schemas/codec.py``.
"""

import argparse
import time

import msgpack

from schemas.codec import decode, encode
from schemas.examples import examples
from schemas.requests import Dispatch, InferenceRequest, ResponseChunk
from schemas.topics import TopicCatalog


def _rate(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    n = parser.parse_args().n
    catalog = TopicCatalog()
    topic_of = {InferenceRequest: catalog.requests, Dispatch: catalog.dispatch,
                ResponseChunk: catalog.responses}
    print(f"{'message':18} {'codec':8} {'bytes':>6} {'encode/s':>10} {'decode/s':>10}")
    for model, topic in topic_of.items():
        message = examples()[model]
        spec = catalog.spec(topic)
        as_json = encode(message)
        as_msgpack = msgpack.packb(message.model_dump(mode="json"))
        rows = [
            ("json", as_json, lambda: encode(message), lambda: decode(spec, as_json)),
            ("msgpack", as_msgpack, lambda: msgpack.packb(message.model_dump(mode="json")),
             lambda: spec.adapter.validate_python(msgpack.unpackb(as_msgpack))),
        ]
        for name, raw, enc, dec in rows:
            print(f"{model.__name__:18} {name:8} {len(raw):>6} {_rate(enc, n):>10,.0f} "
                  f"{_rate(dec, n):>10,.0f}")


if __name__ == "__main__":
    main()
