"""Explicit size limits of every field that crosses a topic.

A message that breaks one of these is not processed: it goes to the dead-letter topic with the
field and the limit named. The limits keep any one record under Kafka's default maximum message
size (1 MiB) and bound the memory a hostile producer can make a consumer spend.
"""

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints

#: Largest encoded record a consumer will try to decode (bytes). Kafka's default is 1,048,588.
MAX_RECORD_BYTES = 1_000_000
#: Prompt tokens of one request; the longest contexts served today are about 1M tokens.
MAX_PROMPT_TOKENS = 1_048_576
#: Tokens one request may generate.
MAX_OUTPUT_TOKENS = 131_072
#: Characters of prompt text carried inline (longer prompts are sent as a token count only).
MAX_PROMPT_CHARS = 500_000
#: Token ids carried inline (about 7 bytes each in JSON).
MAX_PROMPT_TOKEN_IDS = 100_000
#: Prefix block hashes per request (a 1M-token prompt in 512-token blocks is 2,048).
MAX_PREFIX_BLOCKS = 8_192
#: Tokens in one response chunk, and characters of its text (64 a token).
MAX_CHUNK_TOKENS = 4_096
MAX_CHUNK_CHARS = MAX_CHUNK_TOKENS * 64
#: Largest KV block size in tokens (vLLM uses 16; Mooncake's trace 512).
MAX_BLOCK_SIZE = 4_096
#: Ids (request, task, worker, command) and names (tenant, model, GPU type).
MAX_ID_CHARS = 128
MAX_NAME_CHARS = 64
#: A pool is named ``<GPU type>@<model>``: two names and the ``@``.
MAX_POOL_CHARS = 2 * MAX_NAME_CHARS + 1
#: Free-text reasons and error details.
MAX_REASON_CHARS = 2_048
#: Raw bytes kept in a dead letter (the head of the offending record).
MAX_DEAD_LETTER_RAW_BYTES = 65_536
#: Entries in maps that commands carry (pools, tenants, workers).
MAX_MAP_ENTRIES = 1_024
#: Latest time a message may carry: the start of 2100, in epoch milliseconds. The analytics
#: store expires its rows by 32-bit ``DateTime`` rules, which end in February 2106 (a year's
#: TTL before that): before 7 Dec the limit was 2286, and a record stamped from about 2105 on
#: was dropped on insert, with no row and no dead letter.
MAX_EPOCH_MS = 4_102_444_800_000
#: Longest SLO or deadline a request may ask for (one day).
MAX_LATENCY_S = 86_400.0
#: Largest mean inter-token latency a heartbeat reports (one hour, in milliseconds).
MAX_ITL_MS = 3_600_000
#: Longest measured span (``ttft_s``, ``e2e_s``): two valid event times apart. Workers measure
#: from the client's ``created_ms``, which may be any valid epoch, so no tighter bound holds.
MAX_ELAPSED_S = MAX_EPOCH_MS / 1000
#: Placements of one request (``attempt``); the router's retry budget gives up long before.
MAX_ATTEMPTS = 1_000
#: Steps of one task (``step``, ``steps_total``).
MAX_TASK_STEPS = 10_000
#: Requests one worker runs or holds waiting (``running``, ``waiting``); the analytics columns
#: are 32-bit (before 5 Dec a heartbeat saying 2**53 passed every consumer but the sink).
MAX_SEQUENCES = 1_000_000
#: Models one worker says it has loaded.
MAX_MODELS_LOADED = 64
#: GPUs one worker's engine runs on (tensor parallelism, ``--tp``).
MAX_WORKER_GPUS = 64
#: Kafka's own bounds: offsets are 64-bit signed, partitions 32-bit signed.
MAX_OFFSET = 2**63 - 1
MAX_PARTITION = 2**31 - 1

#: The characters of ids, and of names (which have no ``=``).
_ID_PATTERN, _NAME_PATTERN = r"^[A-Za-z0-9._:/@+=-]+$", r"^[A-Za-z0-9._:/@+-]+$"
Id = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS, pattern=_ID_PATTERN)
]
Name = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS, pattern=_NAME_PATTERN)
]
PoolName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_POOL_CHARS, pattern=_NAME_PATTERN)
]

#: The key of the whole fleet's signals, ``fleet:all``, which the streams publish beside each
#: worker's fleet view, ``fleet:<worker id>``: no worker may be named so.
FLEET_KEY = "all"


def _not_the_fleet(worker_id: str) -> str:
    if worker_id == FLEET_KEY:
        raise ValueError(
            f"worker id {FLEET_KEY!r} is the fleet's: the signals of the whole fleet are keyed "
            f"fleet:{FLEET_KEY}, beside each worker's fleet view keyed fleet:<worker id>, so no "
            "worker may be named so")
    return worker_id


#: A worker's id where its heartbeat makes it one of the fleet (``WorkerStatus``).
WorkerId = Annotated[Id, AfterValidator(_not_the_fleet),
                     Field(json_schema_extra={"not": {"const": FLEET_KEY}})]


def pool_name(gpu_type: str, model: str) -> str:
    """A pool's name, as heartbeats, ``ScalePool`` commands, ``autoscaler.pools`` and the
    analytics store key it: its GPU type and model (``h100@llama-2-70b``). It holds no tensor
    parallelism: a pool runs at one (``infra.stack.parse_fleet`` refuses a fleet that gives one
    pool two)."""
    return f"{gpu_type}@{model}"


def addressable(kind: str, map_key: str, fields: Iterable[str], whose: str,
                owner: str | None = None, entry: str = "{}") -> AfterValidator:
    """The check that a ``kind``'s name keys an entry of the map ``map_key`` that a dotted
    configuration key can address: it does not end in ``.`` and one of the entry's ``fields``
    (``tenants.b.burst_s`` is tenant ``b``'s ``burst_s``, so no tenant may be named
    ``b.burst_s``: it could be set only whole, and a record of the key read as setting either).
    ``whose``: what the fields are (``a tenant's limits``); ``owner``: what an entry is (the
    ``kind``); ``entry``: the entry's name made from the name (a model's pools: ``GPU@{}``).
    One rule for tenants, pools and models alike."""
    owner = owner or kind
    fields = frozenset(fields)

    def check(name: str) -> str:
        rest, dot, leaf = name.rpartition(".")
        if dot and leaf in fields:
            raise ValueError(
                f"{kind} name {name!r} ends in '.{leaf}', a field of {whose}: the key "
                f"{map_key}.{entry.format(name)} names the {leaf} of {owner} "
                f"{entry.format(rest)!r}, so no {kind} may be named so")
        return name
    return AfterValidator(check)


#: What a signal is about: a worker id, a pool, a model, a tenant or ``all``.
ScopeKey = Annotated[
    str, StringConstraints(min_length=1, max_length=max(MAX_ID_CHARS, MAX_POOL_CHARS),
                           pattern=_ID_PATTERN)
]
Reason = Annotated[str, StringConstraints(max_length=MAX_REASON_CHARS)]
EpochMs = Annotated[int, Field(ge=0, le=MAX_EPOCH_MS)]
#: Token ids are 32-bit signed; block hashes any 64-bit integer, signed or not.
MAX_TOKEN_ID = 2**31 - 1
MIN_BLOCK_HASH, MAX_BLOCK_HASH = -(2**63), 2**64 - 1
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
BlockHash = Annotated[int, Field(ge=MIN_BLOCK_HASH, le=MAX_BLOCK_HASH)]
Seconds = Annotated[float, Field(gt=0, le=MAX_LATENCY_S)]
Count = Annotated[int, Field(ge=0, le=2**53)]
Sequences = Annotated[int, Field(ge=0, le=MAX_SEQUENCES)]
Elapsed = Annotated[float, Field(ge=0, le=MAX_ELAPSED_S)]
Attempt = Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)]
Step = Annotated[int, Field(ge=1, le=MAX_TASK_STEPS)]
Offset = Annotated[int, Field(ge=0, le=MAX_OFFSET)]


def _an_integer(value: Any) -> Any:
    if type(value) is not int:
        raise ValueError(f"Input should be an integer, not {type(value).__name__}")
    return value


def IntChoice(*choices: int) -> Any:  # noqa: N802 (a type, named as one)
    """An integer that is one of ``choices`` (a ``Literal`` of them in the JSON schema), and no
    boolean or float: pydantic's ``Literal`` compares as Python does (``True == 1.0 == 1``), so
    it took ``true`` and ``1.0`` for 1 even when decoding strictly, where an int field refuses
    both."""
    return Annotated[Literal[choices], BeforeValidator(_an_integer)]
