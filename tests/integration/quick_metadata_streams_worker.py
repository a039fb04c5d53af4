"""``python tests/integration/quick_metadata_streams_worker.py <governor options>``: the streams
worker (``python -m infra.cli``) whose Faust consumer asks for its topics' partitions every
``METADATA_MS`` rather than every 5 minutes (Faust's default), so that a test sees what the
worker does at that refresh: the group rebalances where a partition was added to a topic."""

import sys

import faust

from infra.cli import app as cli

METADATA_MS = 2_000


class QuickMetadataApp(faust.App):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, consumer_metadata_max_age_ms=METADATA_MS, **kwargs)


if __name__ == "__main__":
    faust.App = QuickMetadataApp  # (``streams.app`` makes its app as ``faust.App(...)``)
    cli(sys.argv[1:])
