"""Start and stop the Governor services of a local stack as separate processes.

Each component runs in its own process (``python -m infra.cli router|worker ...``), as it would
in production, so a worker can be killed without touching the rest. Logs go to ``log_dir``.
"""

import contextlib
import fcntl
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from infra.logfiles import LOG_BACKUPS, MAX_LOG_BYTES, rotate
from infra.owners import Owned, read_json, write_atomically
from infra.supervised import WATCH_S, supervisor_env
from schemas.errors import GovernorError
from schemas.limits import pool_name

logger = logging.getLogger(__name__)

#: The worker on slot N serves its metrics this far above ``Stack.metrics_port``, plus N.
WORKER_METRICS_OFFSET = 10
#: Components whose exit does not end a run: the demo reports it instead (see ``dead``).
OPTIONAL_COMPONENTS = frozenset({"sink"})
#: At ``Stack.stop``, how long the workers may finish what they run before they hand the rest
#: back (``Stack.finish_s``), and how long a component has to exit once told to.
STOP_FINISH_S = 5.0
STOP_EXIT_S = 15.0
#: The exit status of a command refused for bad input or setup (``infra.cli.run``): started
#: again, a component would be refused again
SETUP_REFUSED = 2
#: The file in a stack's log dir that names its supervisor and its components (``Stack.record``).
STACK_RECORD = "stack.json"
#: The lock a running ``governor up`` holds on its log dir (``hold_log_dir``).
UP_LOCK = "up.lock"
#: How long the components of a stack whose supervisor was killed may take to stop by
#: themselves: their look at their supervisor (``infra.supervised``), then as long as
#: ``Stack.stop`` gives them.
LEFT_STOP_S = WATCH_S + STOP_FINISH_S + 3 * STOP_EXIT_S


@dataclass
class RestartBackoff:
    """When a crashed component is started again, as an orchestrator would restart it.

    The first crash after a stable run (``stable_s`` since its start) is answered at once; each
    further crash in a row waits twice as long as the one before, from ``first_s`` up to
    ``max_s``, so a component that cannot start does not spin.
    """

    first_s: float = 1.0
    max_s: float = 60.0
    stable_s: float = 60.0
    _started: dict[str, float] = field(default_factory=dict)
    _delay: dict[str, float] = field(default_factory=dict)
    _at: dict[str, float] = field(default_factory=dict)  # name -> when to start it again

    def started(self, name: str, now: float) -> None:
        """``name`` started at ``now``: a restart it waited for is no longer due."""
        self._started[name] = now
        self._at.pop(name, None)

    def started_at(self, name: str) -> float:
        """When ``name`` was last started (-inf: never)."""
        return self._started.get(name, -math.inf)

    def due(self, name: str, now: float) -> bool:
        """Whether ``name``, found exited at ``now``, is to be started again now."""
        if name not in self._at:
            if now - self._started.get(name, -math.inf) >= self.stable_s:
                self._delay[name] = 0.0
            else:
                self._delay[name] = min(max(2 * self._delay.get(name, 0.0), self.first_s),
                                        self.max_s)
            self._at[name] = now + self._delay[name]
        if now < self._at[name]:
            return False
        del self._at[name]
        return True


def _last_error(log: Path, tail_bytes: int = 65_536) -> str:
    """The last ``error:`` line of a component's log (its CLI's message), or where to look."""
    try:
        with open(log, "rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - tail_bytes))
            lines = file.read().decode(errors="replace").splitlines()
    except OSError:
        lines = []
    said = [line.strip() for line in lines if line.lstrip().startswith("error:")]
    return said[-1] if said else f"see {log}"


@dataclass(frozen=True)
class PoolSpec:
    """``count`` workers of one GPU type serving one model, each on ``tp`` GPUs (tensor
    parallelism)."""

    gpu_type: str
    count: int
    model: str = "llama-3-8b"
    tp: int = 1

    @property
    def name(self) -> str:
        return pool_name(self.gpu_type, self.model)

    @property
    def gpus(self) -> int:
        return self.count * self.tp


#: GPUs (or vLLM servers) in one pool of a fleet spec, at most.
MAX_POOL_SIZE = 1024


def worker_tp(gpu_type: str, model: str) -> int:
    """The GPUs one worker of ``model`` runs on on ``gpu_type`` where the fleet spec names none:
    the least tensor parallelism whose GPUs hold it (``models.least_tp``); 1 for a model not
    known (yet: one the configuration declares later). Raises ``ValueError`` for a model that
    fits on none."""
    from workers.sim import models

    try:
        spec, gpu = models.model_spec(model), models.gpu_spec(gpu_type)
    except ValueError:
        return 1
    tp = models.least_tp(spec, gpu)
    if tp is None:
        raise ValueError(models.no_tp(spec, gpu))
    return tp


def pool_of_gpus(gpu_type: str, gpus: int, model: str, tp: int | None = None) -> PoolSpec:
    """``gpus`` GPUs of ``gpu_type`` serving ``model``, as workers of ``tp`` GPUs each (None:
    ``worker_tp``'s); ``ValueError`` where ``gpus`` is not a multiple of that, or (``tp`` named)
    where ``degree_refusal`` refuses it."""
    if tp is not None:
        why = degree_refusal(gpu_type, gpus, model, tp)
        if why:
            raise ValueError(f"pool {gpu_type}@{model}: {why}")
        return PoolSpec(gpu_type, gpus // tp, model, tp)
    tp = worker_tp(gpu_type, model)
    if gpus % tp:
        raise ValueError(f"pool {gpu_type}@{model}: {model} runs on {tp} {gpu_type} GPUs a worker "
                         f"(the least tensor parallelism that holds it), and {gpus} "
                         f"GPU{'s' if gpus > 1 else ''} is not a multiple of {tp}")
    return PoolSpec(gpu_type, gpus // tp, model, tp)


def degree_refusal(gpu_type: str, gpus: int, model: str, tp: int) -> str | None:
    """Why ``gpus`` GPUs of ``gpu_type`` cannot run ``model`` as workers of ``tp`` GPUs each,
    as a fleet spec names it (None: they can): a degree past eight, one that does not divide
    the count, or one the model cannot run at (``models.tp_refusal``: its attention heads, its
    size; for a model not known yet, once it is declared)."""
    from workers.sim import models

    why = models.tp_out_of_range(tp)
    if why:
        return why
    if gpus % tp:
        return f"tp {tp} does not divide its {gpus} GPU{'s' if gpus > 1 else ''}"
    if not models.is_known(model):
        return None
    return models.tp_refusal(models.model_spec(model), models.gpu_spec(gpu_type), tp)


def pool_gpus_args(fleet: Sequence[PoolSpec]) -> list[str]:
    """``governor controllers``' ``--pool-gpus`` for ``fleet``: each pool's GPUs a worker where
    more than one (``parse_pool_gpus`` reads them), so that the autoscaler plans a pool none of
    whose workers it has heard at the degree its workers are started at."""
    return [arg for pool in fleet if pool.tp > 1
            for arg in ("--pool-gpus", f"{pool.name}={pool.tp}")]


def parse_pool_gpus(entries: Sequence[str]) -> dict[str, int]:
    """``--pool-gpus GPU@MODEL=N`` entries as pool name -> GPUs a worker; ``ValueError``
    naming the entry for one not of that form, a GPU type no worker runs on (``worker --gpu``
    refuses it), an N not from 1 to 8 or, for a built-in model, one it cannot run at on that
    GPU type (as ``autoscaler.pools.<pool>.gpus`` is refused), or a pool given two. The GPU
    type is named in lower case, as ``parse_fleet`` names a pool."""
    from workers.sim.models import gpu_spec

    degrees: dict[str, int] = {}
    for entry in entries:
        name, eq, count = entry.rpartition("=")
        gpu_type, at, model = name.partition("@")
        if not (eq and gpu_type and at and model and count.isascii() and count.isdigit()):
            raise ValueError(f"--pool-gpus {entry!r}: expected GPU@MODEL=N (GPUs a worker of the "
                             "pool), e.g. h100@llama-2-70b=4")
        try:
            gpu_spec(gpu_type)
        except ValueError as exc:
            raise ValueError(f"--pool-gpus {entry!r}: {exc}") from None
        name = pool_name(gpu_type.lower(), model)
        why = degree_refusal(gpu_type.lower(), int(count), model, int(count))  # (range first)
        if why:
            raise ValueError(f"--pool-gpus {entry!r}: {why}")
        if degrees.setdefault(name, int(count)) != int(count):
            raise ValueError(f"--pool-gpus gives {name} {degrees[name]} and {count} GPUs a "
                             "worker: a pool runs at one")
    return degrees


_ENTRY_SYNTAX = "expected GPU:COUNT[/tpN][@MODEL], e.g. h100:4 or h100:8/tp4@llama-2-70b"


def _count_and_degree(part: str, count: str) -> tuple[int, int | None]:
    """``COUNT`` or ``COUNT/tpN`` of a fleet entry, as numbers (the degree None where not
    named); ``ValueError`` otherwise."""
    count, slash, degree = count.partition("/")
    degree = degree.lower()
    digits = degree.removeprefix("tp")
    # isascii: str.isdigit() also accepts digits such as '²' that int() refuses.
    if not (count.isascii() and count.isdigit()) or slash and not (
            degree.startswith("tp") and digits.isascii() and digits.isdigit()):
        raise ValueError(f"bad fleet entry {part!r}: {_ENTRY_SYNTAX}")
    return int(count), int(digits) if slash else None


def _fleet_entries(spec: str) -> list[str]:
    """The comma-separated entries of a fleet spec, stripped. An empty one among others
    (``h100:2,`` or ``h100:2,,a100:1``) is an error naming its position: a stray comma is
    as likely a pool left out (an unset variable) as a typo, so it is not skipped silently;
    a spec of no entry at all is left to the caller's "names no pool"."""
    entries = [part.strip() for part in spec.split(",")]
    if any(entries):
        for position, part in enumerate(entries, start=1):
            if not part:
                raise ValueError(f"--fleet {spec!r}: item {position} of {len(entries)} is "
                                 f"empty (a stray comma?); {_ENTRY_SYNTAX}")
    return [part for part in entries if part]


def parse_fleet(spec: str) -> list[PoolSpec]:
    """Parse a fleet spec like ``h100:8,a100:8``, ``h100:8@llama-2-70b`` or
    ``h100:8/tp4@llama-2-70b``: pools of GPU type and count of GPUs, each run as workers of
    the ``/tpN`` GPUs it names, or of the model's ``worker_tp`` (``pool_of_gpus``); with
    ``governor up --vllm-url``, a worker is a vLLM server of that many GPUs."""
    from workers.sim.models import gpu_spec

    pools, entries = [], {}  # (each pool's entry, by name)
    for part in _fleet_entries(spec):
        gpu_count, at, model = part.partition("@")
        gpu, sep, count = gpu_count.partition(":")
        if not sep or not gpu:
            raise ValueError(f"bad fleet entry {part!r}: {_ENTRY_SYNTAX}")
        count, tp = _count_and_degree(part, count)
        if not 1 <= count <= MAX_POOL_SIZE:
            raise ValueError(f"bad fleet entry {part!r}: COUNT must be from 1 to {MAX_POOL_SIZE}")
        try:
            gpu_spec(gpu)
        except ValueError as exc:
            raise ValueError(f"bad fleet entry {part!r}: {exc}") from None
        if at and not model:
            raise ValueError(f"bad fleet entry {part!r}: no model after '@' (leave out '@' for "
                             f"{PoolSpec.model})")
        gpu, model = gpu.lower(), model or PoolSpec.model
        pool = pool_of_gpus(gpu, count, model, tp)
        twin = next((p for p in pools if p.name == pool.name), None)
        if twin is not None and twin.tp != pool.tp:
            raise ValueError(f"bad fleet spec {spec!r}: {entries[pool.name]} and {part} are one "
                             f"pool, {pool.name}, at tp {twin.tp} and tp {pool.tp}: a pool (as "
                             "commands, heartbeats, autoscaler.pools and the analytics store name "
                             "it, GPU@MODEL) runs at one tensor parallelism; give it one")
        if twin is not None:
            raise ValueError(f"bad fleet spec {spec!r}: pool {pool.name} is named twice; give it "
                             "once, with its whole count")
        pools.append(pool)
        entries[pool.name] = part
    if not pools:
        raise ValueError("the fleet spec names no pool, e.g. h100:4")
    return pools


def unserved_warning(fleet: str, served: Collection[str], models: Sequence[str]) -> str | None:
    """What ``sim`` and ``demo`` say of requests for ``models`` (one a request) that no pool of
    ``fleet`` (serving ``served``) serves: None where every one is served, a warning where
    some are not (they are rejected, ``no_capacity``), an error where none is (a run that
    could serve nothing is no run: it would report only rejections)."""
    unserved = sorted(set(models) - set(served))
    if not unserved:
        return None
    count = sum(model in unserved for model in models)
    if count == len(models):
        raise GovernorError(f"no pool of --fleet {fleet} serves {', '.join(unserved)}: none of "
                            f"the {count} requests could be served")
    return (f"warning: no pool of --fleet {fleet} serves {', '.join(unserved)} ({count} of "
            f"{len(models)} requests): they will be rejected")


def metrics_ports(base: int, slots: int) -> dict[str, int]:
    """Where each component serves its metrics, workers on slots below ``slots`` included: the
    router at ``base``, the controllers one above, the streams worker two above, the sink three,
    the worker on slot N ``WORKER_METRICS_OFFSET`` + N above (none when ``base`` is 0)."""
    if not base:
        return {}
    ports = {"router": base, "controllers": base + 1, "streams": base + 2, "sink": base + 3}
    return ports | {f"worker-{n}": base + WORKER_METRICS_OFFSET + n for n in range(slots)}


@dataclass
class Stack:
    """The router and one worker per GPU slot of ``fleet``, as child processes."""

    bootstrap: str
    namespace: str
    fleet: list[PoolSpec]
    log_dir: Path
    speedup: float = 1.0
    engine: str = "sim"
    with_router: bool = True
    extra_worker_args: tuple[str, ...] = ()
    router_args: tuple[str, ...] = ()  # the router's options besides where it reads
    #: Also run a Faust worker of the live-signals app (``governor streams``).
    with_streams: bool = False
    sink_data_dir: Path | None = None  # set: also run the analytics sink on this directory
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    args: dict[str, list[str]] = field(default_factory=dict)  # name -> its command line
    pool_of: dict[int, str] = field(default_factory=dict)  # slot -> pool name
    draining: set[int] = field(default_factory=set)  # slots sent SIGTERM, still finishing
    restarts: RestartBackoff = field(default_factory=RestartBackoff)
    #: Each component's log is rotated past this size, keeping this many older copies
    #: (``rotate_logs``).
    log_max_bytes: int = MAX_LOG_BYTES
    log_backups: int = LOG_BACKUPS
    #: The first of the ports the components serve Prometheus metrics on (``metrics_ports``);
    #: 0: none.
    metrics_port: int = 0
    #: vLLM (or ``governor sim-server``) servers, the one on slot N serving the worker on slot
    #: N (``--engine vllm``): the fleet is theirs, and no worker is added past them.
    vllm_urls: tuple[str, ...] = ()
    #: Whether crashed workers are started again (``revive``, as ``governor up`` calls it): a
    #: crashed worker then keeps its slot and its place in its pool meanwhile (``reviving``).
    #: ``governor demo`` leaves a killed worker dead (its faults start one again).
    revives_workers: bool = False
    #: At ``stop``, how long the workers may finish what they run before they hand the rest back.
    finish_s: float = STOP_FINISH_S
    #: The command that runs the stack (``governor up``), where it records itself, and each
    #: component as it starts, in ``log_dir / STACK_RECORD``: should it be killed outright, the
    #: next one on the log dir waits for them (``wait_for_left_running``). None: no record.
    record: str | None = None
    #: Set once ``stop`` begins: no component is started after it (``_spawn``).
    stopping: bool = field(default=False, init=False)
    _spawning: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False,
                                      compare=False)

    @property
    def slots(self) -> int:
        return sum(pool.count for pool in self.fleet)

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        common = ["--bootstrap", self.bootstrap, "--namespace", self.namespace]
        if self.sink_data_dir is not None:
            self._spawn("sink", ["sink", *common, "--data-dir", str(self.sink_data_dir),
                                 "--sql-port", "0", *self._metrics_args("sink")])
        if self.with_router:
            self._spawn("router", ["router", *common, *self.router_args,
                                   *self._metrics_args("router")])
            # (when its fleet started: a pool size an earlier stack commanded does not undo it;
            # a controllers process revived later gets the same)
            self._spawn("controllers", ["controllers", *common, *pool_gpus_args(self.fleet),
                                        "--fleet-started-ms", str(int(time.time() * 1000)),
                                        *self._metrics_args("controllers")])
        if self.with_streams:
            self._spawn("streams", ["streams", *common, *self._metrics_args("streams")])
        for pool in self.fleet:
            for _ in range(pool.count):
                self.add_worker(pool)

    def add_worker(self, pool: PoolSpec, cold: bool = False) -> int:
        """Start one more worker of ``pool`` on the lowest free slot (not one whose worker
        crashed and is to be started again: ``revive``); return the slot."""
        taken = {int(name.split("-")[1]) for name in self.processes
                 if name.startswith("worker-") and (self.running(name) or self.reviving(name))}
        slot = min(set(range(len(taken) + 1)) - taken)
        if self.vllm_urls and slot >= len(self.vllm_urls):
            raise ValueError(f"no vLLM server for a worker on slot {slot}: the stack has "
                             f"{len(self.vllm_urls)} (--vllm-url)")
        engine = (["--engine", "vllm", "--vllm-url", self.vllm_urls[slot]] if self.vllm_urls
                  else ["--engine", self.engine])
        self._spawn(f"worker-{slot}", [
            "worker", "--bootstrap", self.bootstrap, "--namespace", self.namespace,
            "--slot", str(slot), "--gpu", pool.gpu_type, "--model", pool.model,
            "--speedup", str(self.speedup), *engine, *(["--cold"] if cold else []),
            # (the GPUs each worker bills: simulated at that degree, a vLLM server's, or those a
            # fixed-rate engine, which models none, stands for)
            *(["--tp", str(pool.tp)] if pool.tp > 1 else []),
            *self._metrics_args(f"worker-{slot}"), *self.extra_worker_args,
        ])
        self.pool_of[slot] = pool.name
        return slot

    def metrics_ports(self, slots: int) -> dict[str, int]:
        return metrics_ports(self.metrics_port, slots)

    def _metrics_args(self, name: str) -> list[str]:
        slot = int(name.split("-")[1]) + 1 if name.startswith("worker-") else 0
        port = self.metrics_ports(slot).get(name)
        return ["--metrics-port", str(port)] if port else []

    def workers_of(self, pool_name: str) -> list[int]:
        """Slots of the serving workers of a pool: running, or crashed and to be started again
        (``revive``), and not draining to stop. (A crashed one left out, a restatement of the
        pool's size started a cold worker on another slot, and ``revive`` the crashed one too:
        one worker too many until the next restatement drained one.)"""
        return sorted(slot for slot, name in self.pool_of.items()
                      if name == pool_name and (self.running(f"worker-{slot}")
                                                or self.reviving(f"worker-{slot}"))
                      and slot not in self.draining)

    def reviving(self, name: str) -> bool:
        """Whether worker ``name`` crashed (exited other than 0 and not refused for its setup,
        not drained) and ``revive`` starts it again after its backoff."""
        proc = self.processes.get(name)
        return self.revives_workers and proc is not None and \
            proc.poll() not in (None, 0, SETUP_REFUSED) and \
            int(name.split("-")[1]) not in self.draining

    def scale(self, pool: PoolSpec, replicas: int, breaker_open: Collection[str] = ()) -> str:
        """Start cold workers or stop (drain) the newest ones until the pool has ``replicas``
        serving. A draining worker no longer counts (it only finishes what it holds), and is
        sent SIGTERM once. ``breaker_open``: workers a breaker keeps from serving, drained
        before the others."""
        slots = self.workers_of(pool.name)
        for _ in range(replicas - len(slots)):
            self.add_worker(pool, cold=True)
        # newest first, by start (a new worker takes the lowest free slot: the highest slot is
        # no guide, and a warm worker was drained while a cold one went on loading)
        # (and first of all one crashed, waiting to be started again, then one behind an open
        # breaker: they serve nothing)
        by_start = sorted(slots, key=lambda n: (self.reviving(f"worker-{n}"),
                                                f"worker-{n}" in breaker_open,
                                                self.restarts.started_at(f"worker-{n}"), n))
        for slot in reversed(by_start[replicas:]):
            self.processes[f"worker-{slot}"].send_signal(signal.SIGTERM)  # drains, hands back
            self.draining.add(slot)
        return f"{pool.name}: {len(slots)} -> {replicas}"

    def _spawn(self, name: str, args: list[str]) -> None:
        """Start ``name``; ``RuntimeError`` once ``stop`` has begun. (Under a lock that ``stop``
        takes: a start from another thread, ``demo --fault restart:...``'s, either is recorded
        before ``stop`` looks what to stop or is refused. Before 7 Dec a restart that the end of
        a demo cut short in its thread went on to start the component as ``stop`` ran, and
        left it running.)"""
        with self._spawning:
            if self.stopping:
                raise RuntimeError(f"the stack is stopping: {name} is not started again")
            if name.startswith("worker-"):
                self.draining.discard(int(name.split("-")[1]))  # a new process on the slot
            self.args[name] = args
            self.restarts.started(name, time.monotonic())
            self.processes[name] = self._start_process(name, args)
            if self.record is not None:
                self._write_record(self.record)
        logger.info("started %s (pid %d)", name, self.processes[name].pid)

    def _write_record(self, command: str) -> None:
        """Record this process, as ``command``, and the components that run, each by its pid
        and its start time (``STACK_RECORD``: read by ``left_running``)."""
        running = {name: owned.as_json() for name, process in self.processes.items()
                   if process.poll() is None
                   and (owned := Owned.of(process.pid, name)) is not None}
        write_atomically(self.log_dir / STACK_RECORD,
                         {"supervisor": Owned.this(command).as_json(), "components": running})

    def _start_process(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        # (--log-level, as the CLI takes it: the nearest of its four levels)
        effective = logging.getLogger().getEffectiveLevel()
        level = next((known for known in ("DEBUG", "INFO", "WARNING")
                      if effective <= logging.getLevelName(known)), "ERROR")
        # In a process group of its own: a terminal's Ctrl-C (SIGINT to its foreground group)
        # reaches only the command that started it, whose ``stop`` ends the components in order
        # (and one that outlives this process stops itself: ``infra.supervised``)
        process = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", *args],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "GOVERNOR_LOG_LEVEL": level,
                 **supervisor_env()},
            process_group=0,
        )
        log.close()
        return process

    def dead(self) -> list[str]:
        """Components that exited on their own (optional ones aside: see ``running``; a worker
        drained on a command stopped as told)."""
        return [name for name, proc in self.processes.items()
                if name not in OPTIONAL_COMPONENTS and proc.poll() is not None
                and not (name.startswith("worker-") and int(name[7:]) in self.draining)]

    def revive(self, now: float | None = None) -> dict[str, int]:
        """Start again, each after its backoff, the control-plane components (router,
        controllers, streams, sink) that exited, and the workers that crashed (exited other
        than 0, not drained); return those started now, each with the status it exited with.
        One refused for bad input or setup (``SETUP_REFUSED``) is not: see ``refused``.
        ``governor up`` calls it as an orchestrator restarts a crashed pod (not after
        ``stop``); a restarted router reads back what it had placed.

        A worker that exited 0 drained on a command (the autoscaler's ``ScalePool``), and is
        not started again. A new worker on a crashed worker's slot reads the dispatches its
        predecessor had not finished: those the router resumed elsewhere are cancelled behind
        them, and one started within the router's heartbeat timeout serves the others again from
        their first token (``demo --fault start:SLOT@S``; both in
        ``tests/e2e/test_fault_scenarios.py``). Before 5 Dec crashed workers were left to the
        autoscaler, and a fixed fleet lost them for good (a broker restart under load ended
        every busy worker's process)."""
        now = time.monotonic() if now is None else now
        revived = {}
        for name, proc in list(self.processes.items()):
            if proc.poll() in (None, SETUP_REFUSED):
                continue
            # (before ``due``: a worker drained is not started again, and its exit is no crash
            # to count into its slot's backoff; before 7 Dec it was, at each call, and the next
            # worker on the slot waited up to 60 s to be started again, not 1 s)
            if name.startswith("worker-") and (proc.returncode == 0
                                               or int(name[7:]) in self.draining):
                continue
            if not self.restarts.due(name, now):
                continue
            logger.warning("%s exited (status %s); starting it again", name, proc.returncode)
            revived[name] = proc.returncode
            self.respawn(name)
        return revived

    def refused(self) -> dict[str, str]:
        """The components that exited refused for bad input or setup (``SETUP_REFUSED``: not
        started again), each with the ``error:`` line its log ends with."""
        return {name: _last_error(self.log_dir / f"{name}.log")
                for name, proc in self.processes.items() if proc.poll() == SETUP_REFUSED}

    def rotate_logs(self) -> list[str]:
        """Rotate the logs of the components grown past ``log_max_bytes`` (``infra.logfiles``);
        return their names. ``governor up``, which runs until stopped, calls it as it goes."""
        return [name for name in self.processes
                if rotate(self.log_dir / f"{name}.log", self.log_max_bytes, self.log_backups)]

    def running(self, name: str) -> bool:
        return name in self.processes and self.processes[name].poll() is None

    def running_workers(self) -> dict[int, str]:
        """The slots of the worker processes running, each with its pool's name."""
        return {slot: pool for slot, pool in self.pool_of.items()
                if self.running(f"worker-{slot}")}

    def kill(self, name: str) -> None:
        """SIGKILL one component (fault injection), and wait for it to be gone: a fault that
        starts it again a moment later found it still running on a loaded machine."""
        self.processes[name].kill()
        self.processes[name].wait()

    def pause(self, name: str) -> None:
        """SIGSTOP one component (fault injection: frozen, its sockets held open)."""
        self.processes[name].send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        """SIGCONT a component ``pause`` froze."""
        if self.processes[name].poll() is None:
            self.processes[name].send_signal(signal.SIGCONT)

    def respawn(self, name: str) -> None:
        """Start an exited component again with its command line (a worker: on its slot)."""
        if self.running(name):
            raise RuntimeError(f"{name} is still running")
        self._spawn(name, self.args[name])

    def restart(self, name: str) -> None:
        """SIGKILL one component and start it again with the same command line (fault
        injection: a crash that an orchestrator answers with a restart)."""
        self.kill(name)
        self._spawn(name, self.args[name])

    def stop(self, timeout_s: float = STOP_EXIT_S) -> list[str]:
        """Stop the components in ``stop_order``, each step once the one before has exited:
        SIGTERM, then SIGKILL what has not exited within ``timeout_s`` of its step; return the
        components killed so (each logged: a component that does not exit on SIGTERM is a bug).
        The workers first finish what they run for up to ``finish_s``; a second SIGTERM then
        has them hand the rest back at once (``WorkerService.hand_back_now``), rather than
        after their ``--drain-timeout-s`` (one draining already, on a ``scale``, does at once).
        They go first, so that the sink, stopped last, finds their final heartbeats (``stopped``)
        on the telemetry topic and stores them before it exits (it reads its partitions to their
        end offsets as of its stop: ``analytics.sink``). So a stop takes at most ``finish_s`` + 3
        ``timeout_s``, and a few seconds where nothing is killed. Before 6 Dec every component had
        SIGTERM at once, and a sink could exit before it stored the workers' last heartbeats; and a
        worker drained for up to 30 s while ``stop`` killed it after 15 s, its requests neither
        finished nor handed back."""
        with self._spawning:  # (a start under way in another thread ends first)
            self.stopping = True
        killed: list[str] = []
        for step in self.stop_order():
            started = time.monotonic()
            self._terminate(step)
            if all(name.startswith("worker-") for name in step):
                self._terminate(self._still_running(step, self.finish_s))
            for name in self._still_running(step, timeout_s):
                logger.warning("%s did not exit within %g s of SIGTERM; killing it", name,
                               timeout_s)
                self.processes[name].kill()
                self.processes[name].wait()
                killed.append(name)
            logger.info("stopped %s in %.1f s", ", ".join(step), time.monotonic() - started)
        if self.record is not None:  # (none of them runs now)
            (self.log_dir / STACK_RECORD).unlink(missing_ok=True)
        return killed

    def _terminate(self, names: list[str]) -> None:
        """SIGTERM those of ``names`` still running, each SIGCONT first: one ``pause`` froze
        handles SIGTERM only once resumed (a running one ignores SIGCONT). Before 6 Dec a paused
        component was killed after ``stop``'s ``timeout_s``."""
        for name in names:
            if self.processes[name].poll() is None:
                self.processes[name].send_signal(signal.SIGCONT)
                self.processes[name].send_signal(signal.SIGTERM)

    def _still_running(self, names: list[str], timeout_s: float) -> list[str]:
        """Those of ``names`` that have not exited within ``timeout_s`` from now."""
        deadline = time.monotonic() + timeout_s
        for name in names:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.processes[name].wait(timeout=max(0.0, deadline - time.monotonic()))
        return [name for name in names if self.processes[name].poll() is None]

    def stop_order(self) -> list[list[str]]:
        """The steps ``stop`` takes: the workers, then the router, controllers and streams,
        then the sink."""
        def step(name: str) -> int:
            return 0 if name.startswith("worker-") else 2 if name == "sink" else 1
        return [names for rank in range(3)
                if (names := [name for name in self.processes if step(name) == rank])]


def hold_log_dir(log_dir: Path) -> IO[str]:
    """Hold ``log_dir`` for this ``governor up``: a lock on its ``UP_LOCK``, which the system
    lets go when the process ends, however it ends, and which names this process as it holds
    it. ``GovernorError`` naming the ``up`` that holds it already, or why the lock cannot be
    taken (a file of another user's, a file system without locks). Two on one log dir wrote
    each other's logs and stack record (the second's record hid the first's components from
    the ``up`` after a kill) and met each other's sink on one store; before 7 Dec nothing
    refused the second. The file returned must stay open."""
    path = log_dir / UP_LOCK
    try:
        lock = open(path, "a+")  # noqa: SIM115 - held for the process's life
    except OSError as exc:
        raise GovernorError(f"--log-dir {log_dir}: cannot open {path.name} to hold it for this "
                            f"up: {exc.strerror or exc}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        holder = Owned.from_json(read_json(path))
        who = str(holder) if holder is not None and holder.alive() else "another governor up"
        raise GovernorError(f"{who} runs on --log-dir {log_dir}: stop it first, or give this one "
                            "another --log-dir (and --data-dir)") from None
    except OSError as exc:
        lock.close()
        raise GovernorError(f"--log-dir {log_dir}: cannot lock {path.name} to hold it for this "
                            f"up: {exc.strerror or exc}") from None
    lock.truncate(0)  # (held: who holds it, for the next one to name)
    lock.write(json.dumps(Owned.this("governor up").as_json()) + "\n")
    lock.flush()
    return lock


def left_running(log_dir: Path) -> tuple[Owned | None, dict[str, Owned]]:
    """The supervisor a stack recorded in ``log_dir`` (``Stack.record``) and those of its
    components that still run, where that supervisor is gone; (None, {}) where it runs still,
    or no stack recorded itself there."""
    record = read_json(log_dir / STACK_RECORD)
    if not isinstance(record, dict):
        return None, {}
    supervisor = Owned.from_json(record.get("supervisor"))
    if supervisor is None or supervisor.alive():
        return None, {}
    components = record.get("components")
    return supervisor, {
        name: owned for name, value in (components.items() if isinstance(components, dict)
                                        else ())
        if (owned := Owned.from_json(value)) is not None and owned.alive()}


def wait_for_left_running(log_dir: Path, say: Callable[[str], None],
                          timeout_s: float = LEFT_STOP_S) -> list[str]:
    """Wait until the components that a ``governor up`` killed outright (SIGKILL, its machine
    session ended: none of its handlers ran) left running on ``log_dir`` have stopped. They
    stop by themselves once it is gone (``infra.supervised``), but not at once: a worker
    finishes what it runs, the sink its flush; and before 7 Dec a stack started meanwhile met
    them: its worker refused the slot of one still heart-beating (``SlotInUse``), its sink the
    store one held, and the whole stack stopped. Said, naming them, where there are any; those
    still running ``timeout_s`` on (paused, hung) are killed, as ``Stack.stop`` kills a
    component that does not exit: their names are returned."""
    supervisor, left = left_running(log_dir)
    if not left:
        return []
    say(f"{supervisor}, whose logs are in {log_dir}, is gone; its components stop by "
        f"themselves: waiting for {_named(left)}")
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        time.sleep(0.2)  # (polls their exits, with a deadline: they are not this one's children)
        left = {name: owned for name, owned in left.items() if owned.alive()}
    if not left:
        say("they have stopped")
        return []
    say(f"killing {_named(left)}: still running {timeout_s:g} s on")
    for owned in left.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(owned.pid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_EXIT_S  # (gone once the system has taken it down)
    while any(owned.alive() for owned in left.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted(left)


def _named(components: dict[str, Owned]) -> str:
    return ", ".join(f"{name} (pid {owned.pid})" for name, owned in sorted(components.items()))
