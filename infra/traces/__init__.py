"""Request traces: loaders for Azure CSV, Mooncake JSONL and Governor JSONL, and the built-in
Azure-conversation-like synthetic workload used when no trace file is given.

See ``DESIGN.md`` "Trace formats". Everything loads into the format-neutral
:class:`TraceRequest`; bad input raises :class:`TraceError` (a ``TerminalError``).
"""

from infra.traces.loaders import (
    TraceFormat,
    detect_format,
    load_trace,
    request_row,
    write_governor_jsonl,
)
from infra.traces.model import TraceError, TraceRequest
from infra.traces.synthetic import azure_like_workload, lognormal_from_quantiles

__all__ = [
    "TraceError",
    "TraceFormat",
    "TraceRequest",
    "azure_like_workload",
    "detect_format",
    "load_trace",
    "lognormal_from_quantiles",
    "request_row",
    "write_governor_jsonl",
]
