"""The base of every message on a Governor topic."""

from pydantic import BaseModel, ConfigDict, Field

from schemas.limits import EpochMs

#: The version every message is written with today. Readers accept versions up to this one.
SCHEMA_VERSION = 1


class Message(BaseModel):
    """A record on a topic: immutable, strict about unknown fields, stamped with its event time.

    Subclasses add a ``type`` literal that tells the codec which model a record holds.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: int = Field(default=SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    event_time_ms: EpochMs
