"""The insert contract of the analytics store: the columns the sink writes to each base table.

The tables themselves are created by the versioned migrations in ``analytics/migrations`` (their
DDL, keys and TTLs are documented there); this module names the columns the sink fills, in order,
with their Arrow types, and turns a list of row tuples into an Arrow table for ``insert_arrow``.
Columns the sink leaves out (``ingested``) take their defaults. A unit test checks this contract
against the tables the migrations create.

Every row starts with the Kafka coordinates of its record and its event time (epoch ms).
"""

import re
from dataclasses import dataclass

import pyarrow as pa

from analytics.migrations import LATEST_VERSION

SCHEMA_VERSION = LATEST_VERSION

_TIME = pa.timestamp("ms")
_STR = pa.string()
_BYTES = pa.binary()
_U8, _U16, _U32, _U64 = pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()
_F64 = pa.float64()

COORDINATES = (
    ("kafka_topic", _STR), ("kafka_partition", _U32), ("kafka_offset", _U64), ("time", _TIME),
)


@dataclass(frozen=True)
class TableSpec:
    """A base table the sink inserts into: its name and the columns after the coordinates."""

    name: str
    own_columns: tuple[tuple[str, pa.DataType], ...]

    @property
    def columns(self) -> tuple[tuple[str, pa.DataType], ...]:
        return COORDINATES + self.own_columns

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(name, kind) for name, kind in self.columns])

    def to_arrow(self, rows: list[tuple]) -> pa.Table:
        """Rows (tuples in column order) as an Arrow table with this table's types."""
        return self.from_columns(self.columns_of(rows))

    def columns_of(self, rows: list[tuple]) -> list[tuple]:
        """Rows (tuples in column order) as columns, one tuple of values each."""
        width = len(self.columns)
        columns = list(zip(*rows, strict=True)) if rows else [()] * width
        if len(columns) != width:
            raise ValueError(f"{self.name}: rows have {len(columns)} values, the table {width}")
        return columns

    def from_columns(self, columns: list[tuple]) -> pa.Table:
        """Columns (of ``columns_of``) as an Arrow table with this table's types."""
        arrays = [pa.array(values, type=kind) for values, (_, kind) in zip(columns, self.columns)]
        return pa.Table.from_arrays(arrays, schema=self.arrow_schema)


def _spec(name: str, *columns: tuple[str, pa.DataType]) -> TableSpec:
    return TableSpec(name, tuple(columns))


TABLES: dict[str, TableSpec] = {spec.name: spec for spec in (
    _spec("request_events", ("type", _STR), ("request_id", _STR), ("task_id", _STR),
          ("tenant", _STR), ("model", _STR), ("worker_id", _STR), ("attempt", _U16),
          ("priority", _U8), ("step", _U32), ("steps_total", _U32), ("prompt_tokens", _U32),
          ("max_tokens", _U32), ("output_tokens", _U32), ("cached_tokens", _U32),
          ("tokens_done", _U32), ("ttft_s", _F64), ("e2e_s", _F64), ("created", _TIME),
          ("deadline", _TIME), ("reason", _STR), ("finish_reason", _STR), ("detail", _STR),
          ("retry_after_s", _F64), ("ttft_slo_s", _F64), ("prefix_blocks", _U32),
          ("block_size", _U16)),
    _spec("dispatches", ("type", _STR), ("request_id", _STR), ("task_id", _STR), ("tenant", _STR),
          ("model", _STR), ("worker_id", _STR), ("slot", _U32), ("attempt", _U16),
          ("resume_from_token", _U32), ("router_id", _STR)),
    _spec("response_chunks", ("request_id", _STR), ("worker_id", _STR), ("attempt", _U16),
          ("token_offset", _U32), ("tokens", _U32), ("text_chars", _U32), ("is_final", _U8),
          ("finish_reason", _STR)),
    _spec("worker_status", ("worker_id", _STR), ("slot", _U32), ("pool", _STR),
          ("gpu_type", _STR), ("gpus", _U16), ("models_loaded", pa.list_(_STR)), ("state", _STR),
          ("kv_blocks_used", _U64), ("kv_blocks_free", _U64), ("running", _U32),
          ("waiting", _U32), ("prefix_cache_queries", _U64), ("prefix_cache_hits", _U64),
          ("preemptions", _U64), ("requests_completed", _U64), ("started", _TIME)),
    _spec("kv_events", ("type", _STR), ("worker_id", _STR), ("block_size", _U16),
          ("blocks", _U32)),
    _spec("signals", ("scope", _STR), ("scope_key", _STR), ("window_s", _F64),
          ("window_end", _TIME), ("signal_values", pa.map_(_STR, _F64))),
    _spec("control_commands", ("type", _STR), ("command_id", _STR), ("issued_by", _STR),
          ("target", _STR), ("reason", _STR), ("params", _STR)),
    _spec("config_changes", ("type", _STR), ("setting", _STR), ("value", _STR), ("set_by", _STR),
          ("component", _STR), ("config_offset", _U64), ("reason", _STR)),
    _spec("dead_letters", ("source_topic", _STR), ("source_partition", _U32),
          ("source_offset", _U64), ("consumer", _STR), ("reason", _STR), ("error", _STR),
          ("record_key", _BYTES), ("raw_head", _BYTES), ("raw_size", _U32)),
)}

#: Tables whose rows are one Kafka record each (what "every record lands once" is checked on).
RECORD_TABLES = tuple(TABLES)


def database_for(namespace: str) -> str:
    """The database that holds one topic namespace: ``governor`` for the default namespace.

    ClickHouse identifiers are simplest as letters, digits and ``_``; other characters of a
    namespace (``-`` and ``.``) become ``_``.
    """
    return re.sub(r"[^A-Za-z0-9_]", "_", namespace)
