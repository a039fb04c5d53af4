"""Tests of infra.stack.parse_fleet (the ``--fleet`` spec) and PoolSpec."""

from __future__ import annotations

import signal

import pytest

from infra.stack import PoolSpec, RestartBackoff, Stack, parse_fleet
from schemas.config import ModelShape
from workers.sim import models


@pytest.mark.parametrize(
    ("spec", "pools"),
    [
        ("h100:8,a100:8", [PoolSpec("h100", 8), PoolSpec("a100", 8)]),
        ("h100:2@llama-3-70b", [PoolSpec("h100", 2, "llama-3-70b")]),
        ("h100:1", [PoolSpec("h100", 1, "llama-3-8b")]),
        (" h100:8 , a100:4@llama-3-70b ",
         [PoolSpec("h100", 8), PoolSpec("a100", 4, "llama-3-70b")]),
        ("H100:3", [PoolSpec("h100", 3)]),
        ("h100:08", [PoolSpec("h100", 8)]),
        ("h100:1,h100:2@llama-3-70b", [PoolSpec("h100", 1), PoolSpec("h100", 2, "llama-3-70b")]),
    ],
)
def test_parse_fleet(spec: str, pools: list[PoolSpec]) -> None:
    assert parse_fleet(spec) == pools


@pytest.mark.parametrize(
    ("spec", "entry"),
    [
        ("h100", "h100"),
        ("h100:0", "h100:0"),
        ("h100:x", "h100:x"),
        ("h100:-1", "h100:-1"),
        ("h100:1.5", "h100:1.5"),
        (":4", ":4"),
        ("h100:", "h100:"),
        ("h100:8,a100", "a100"),
        ("h100:8, a100:zero@m", "a100:zero@m"),
        ("h100:²", "h100:²"),  # a Unicode digit that int() refuses
        ("h100:٣", "h100:٣"),  # an Arabic-Indic digit
        ("h100:1025", "h100:1025"),  # over MAX_POOL_SIZE
        ("h100:2@", "h100:2@"),  # no model (an unset $MODEL?): not the default taken silently
    ],
)
def test_bad_entries_are_named(spec: str, entry: str) -> None:
    with pytest.raises(ValueError, match="bad fleet entry") as info:
        parse_fleet(spec)
    assert repr(entry) in str(info.value)


@pytest.mark.parametrize(("spec", "position"), [
    ("h100:2,", "item 2 of 2"),
    ("h100:2,,a100:1", "item 2 of 3"),
    (",h100:2", "item 1 of 2"),
    ("h100:2, ", "item 2 of 2"),
])
def test_an_empty_item_is_refused_by_its_position(spec: str, position: str) -> None:
    with pytest.raises(ValueError, match=f"--fleet .*: {position} is empty"):
        parse_fleet(spec)


def test_a_pool_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="pool h100@llama-3-8b is named twice"):
        parse_fleet("h100:2,a100:1,h100:3@llama-3-8b")


@pytest.mark.parametrize("spec", ["", ",", " , ", "   "])
def test_empty_fleet_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="names no pool"):
        parse_fleet(spec)


@pytest.mark.parametrize(("spec", "pools"), [
    # Llama-2-70B holds on two H100s (or A100s, or H200s) at the least: 8 GPUs, 4 workers of 2
    ("h100:8@llama-2-70b", [PoolSpec("h100", 4, "llama-2-70b", tp=2)]),
    ("a100:2@llama-2-70b,h100:3", [PoolSpec("a100", 1, "llama-2-70b", tp=2), PoolSpec("h100", 3)]),
    ("h200:1024@llama-2-70b", [PoolSpec("h200", 512, "llama-2-70b", tp=2)]),
])
def test_a_pool_is_its_gpus_run_as_workers_of_the_models_least_tensor_parallelism(
        spec: str, pools: list[PoolSpec]) -> None:
    assert parse_fleet(spec) == pools
    assert [pool.gpus for pool in pools] == [int(part.split(":")[1].split("@")[0])
                                             for part in spec.split(",")]


@pytest.mark.parametrize("spec", ["h100:3@llama-2-70b", "h100:1@llama-2-70b",
                                  "h100:2,a100:5@llama-2-70b"])
def test_gpus_that_are_not_whole_workers_are_refused_naming_pool_degree_and_count(
        spec: str) -> None:
    count = spec.rsplit(":", 1)[1].split("@")[0]
    with pytest.raises(ValueError) as info:
        parse_fleet(spec)
    gpu = spec.rsplit(":", 1)[0].rsplit(",", 1)[-1]
    assert str(info.value) == (f"pool {gpu}@llama-2-70b: llama-2-70b runs on 2 {gpu} GPUs a "
                               f"worker (the least tensor parallelism that holds it), and "
                               f"{count} GPU{'s' if count != '1' else ''} is not a "
                               "multiple of 2")


def test_a_fleet_of_vllm_servers_counts_gpus() -> None:
    """``governor up --vllm-url``: one worker a server, a pool's count GPUs as without it (a
    70B model's servers on two H100s each, the least that holds it; a model the simulator does
    not know, one GPU a server). Before 6 Dec the count was servers, each billed one GPU."""
    assert parse_fleet("h100:4@llama-2-70b,a100:3,h100:2@org/served-70b") == [
        PoolSpec("h100", 2, "llama-2-70b", tp=2), PoolSpec("a100", 3),
        PoolSpec("h100", 2, "org/served-70b")]


#: (5 KV heads: tp 5 splits them too; 4, as before 6 Dec (evening), would be refused by vLLM at
#: tp 5, each KV head on 1.25 GPUs: ``tests/unit/workers/test_tp_kv_heads.py``)
_TWENTY_HEADS = ModelShape(params_b=160.0, n_layers=80, n_heads=20, n_kv_heads=5, head_dim=256,
                           hidden_size=5120, intermediate_size=20480, vocab_size=32000)


def test_a_pools_degree_is_the_least_that_divides_the_heads_as_vllm_and_worker_tp_take() -> None:
    """A model of 20 heads too large for 4 H100s runs at tp 5, the least degree that holds it
    and divides its heads (any, as vLLM and `governor worker --tp` take it). Before 6 Dec the
    fleet tried 1, 2, 4 and 8 only: it gave it 8, a degree vLLM and a worker refuse (`--tp 8
    does not divide ... 20 attention heads`), and refused `h100:10@twenty-160b` as not a
    multiple of 8."""
    models.configure_models({"twenty-160b": _TWENTY_HEADS})
    try:
        spec, gpu = models.model_spec("twenty-160b"), models.gpu_spec("h100")
        assert "does not divide twenty-160b's 20 attention heads" in models.tp_refusal(spec, gpu, 8)
        assert models.least_tp(spec, gpu) == 5 and models.tp_refusal(spec, gpu, 5) is None
        assert parse_fleet("h100:10@twenty-160b") == [PoolSpec("h100", 2, "twenty-160b", 5)]
        assert parse_fleet("h100:10/tp5@twenty-160b") == parse_fleet("h100:10@twenty-160b")
    finally:
        models.configure_models({})


def test_a_model_whose_heads_no_degree_that_holds_it_divides_is_refused_saying_so() -> None:
    """20 heads, too large for 5 H100s: 6, 7 and 8 GPUs hold it, and none divides its heads."""
    models.configure_models({"twenty-200b": _TWENTY_HEADS.model_copy(update={"params_b": 200.0})})
    try:
        with pytest.raises(ValueError, match="^twenty-200b fits on h100 at no tensor parallelism "
                                             "from 1 to 8 that divides its 20 attention heads"):
            parse_fleet("h100:8@twenty-200b")
    finally:
        models.configure_models({})


def test_a_model_that_fits_on_no_tensor_parallelism_is_refused() -> None:
    models.configure_models({"huge-400b": ModelShape(
        params_b=400.0, n_layers=120, n_heads=128, n_kv_heads=8, head_dim=128,
        hidden_size=16384, intermediate_size=53248, vocab_size=32000)})
    try:
        with pytest.raises(ValueError, match="^huge-400b does not fit on 8 x a100$"):
            parse_fleet("a100:8@huge-400b")
    finally:
        models.configure_models({})


def test_a_worker_of_several_gpus_is_started_with_its_tensor_parallelism(tmp_path) -> None:
    """``governor up``/``demo --fleet h100:4@llama-2-70b``: two workers, each ``--tp 2`` (before
    6 Dec, refused: the model does not fit on one H100)."""
    pools = parse_fleet("h100:4@llama-2-70b,a100:1")
    stack = _Stack("127.0.0.1:1", "ns", pools, tmp_path, with_router=False)
    stack.start()
    assert stack.slots == 3
    tp = {name: args[args.index("--tp") + 1] if "--tp" in args else None
          for name, args in stack.args.items()}
    assert tp == {"worker-0": "2", "worker-1": "2", "worker-2": None}
    fixed = _Stack("127.0.0.1:1", "ns", pools, tmp_path, engine="fixed-rate", with_router=False)
    fixed.start()  # (a fixed-rate worker models no GPU, but bills its pool's two a worker)
    assert {name: args[args.index("--tp") + 1] if "--tp" in args else None
            for name, args in fixed.args.items()} == tp


def test_the_supervisor_adds_a_worker_of_several_gpus_with_its_tensor_parallelism(
        tmp_path) -> None:
    """The autoscaler's ``ScalePool`` counts workers; one more of a Llama-2-70B pool on H100s
    is started ``--tp 2`` (before 6 Dec, refused: the model does not fit on one H100)."""
    from infra.supervisor import carry_out

    stack = _Stack("127.0.0.1:1", "ns", parse_fleet("h100:2@llama-2-70b"), tmp_path,
                   with_router=False)
    stack.start()
    said: list[str] = []
    carry_out([_scale("h100@llama-2-70b", "h100", "llama-2-70b", 2)], stack, 32, {},
              said.append)
    assert stack.workers_of("h100@llama-2-70b") == [0, 1], said
    assert stack.args["worker-1"][stack.args["worker-1"].index("--tp") + 1] == "2"


def test_pool_name_and_defaults() -> None:
    pool = PoolSpec("h100", 2)
    assert pool.model == "llama-3-8b"
    assert pool.name == "h100@llama-3-8b"
    assert PoolSpec("a100", 1, "llama-3-70b").name == "a100@llama-3-70b"


def test_a_crash_after_a_stable_run_is_restarted_at_once_and_a_crash_loop_backs_off() -> None:
    backoff = RestartBackoff(first_s=1.0, max_s=4.0, stable_s=60.0)
    backoff.started("router", 0.0)
    assert backoff.due("router", 100.0)  # ran 100 s: at once
    backoff.started("router", 100.0)
    # It crashes again 2 s later, and again and again: 1 s, 2 s, 4 s, then 4 s (the cap).
    now = 102.0
    for delay in (1.0, 2.0, 4.0, 4.0):
        assert not backoff.due("router", now)
        assert not backoff.due("router", now + delay - 0.01)
        assert backoff.due("router", now + delay)
        backoff.started("router", now + delay)
        now += delay + 0.5  # the new process dies half a second after its start
    backoff.started("worker-0", now - 70.0)
    assert backoff.due("worker-0", now)  # another component's first crash: at once
    backoff.started("router", now + 70.0)
    assert backoff.due("router", now + 140.0)  # stable again for 70 s: at once


class _Process:
    """A worker process as ``Stack.scale`` sees it: running until it exits."""

    def __init__(self) -> None:
        self.returncode, self.signals, self.pid = None, [], 0

    def poll(self):
        return self.returncode

    def send_signal(self, sig) -> None:
        self.signals.append(sig)  # SIGTERM: it drains, still running for a while


class _Stack(Stack):
    def _start_process(self, name: str, args: list[str]) -> _Process:
        return _Process()


class _Exiting(_Process):
    """A process that exits on SIGTERM once it is waited for, saying both in ``log``."""

    def __init__(self, name: str, log: list) -> None:
        super().__init__()
        self.name, self.log = name, log

    def send_signal(self, sig) -> None:
        if sig == signal.SIGTERM:  # (a SIGCONT comes before each, for one paused)
            self.log.append(("SIGTERM", self.name))

    def wait(self, timeout=None) -> int:
        if self.returncode is None:
            self.returncode = 0
            self.log.append(("exited", self.name))
        return 0


def test_stop_stops_the_workers_first_and_the_sink_last_once_the_others_exited(tmp_path) -> None:
    """The sink gets SIGTERM only once every worker has exited (their last heartbeats written)
    and the control plane after them: before 6 Dec all had it at once."""
    log: list = []

    class Stack_(Stack):
        def _start_process(self, name: str, args: list[str]) -> _Exiting:
            return _Exiting(name, log)

    stack = Stack_("127.0.0.1:1", "ns", [PoolSpec("h100", 2)], tmp_path, with_streams=True,
                   sink_data_dir=tmp_path / "data")
    stack.start()
    stack.stop()
    workers = [("SIGTERM", "worker-0"), ("SIGTERM", "worker-1"),
               ("exited", "worker-0"), ("exited", "worker-1")]
    control = ["router", "controllers", "streams"]
    assert log == [*workers, *[("SIGTERM", name) for name in control],
                   *[("exited", name) for name in control], ("SIGTERM", "sink"), ("exited", "sink")]


def test_no_component_is_started_once_the_stack_stops(tmp_path) -> None:
    """``demo --fault restart:...`` restarts a component in a thread of its own; the end of the
    run cancels the fault, not the thread, and ``stop`` runs meanwhile. Before 7 Dec the
    thread's start went on, after ``stop`` had looked what to stop: the component was left
    running. A start once ``stop`` has begun is refused."""
    log: list = []

    class Killable(_Exiting):
        def kill(self) -> None:
            if self.returncode is None:
                self.returncode = -9

    class Stack_(Stack):
        def _start_process(self, name: str, args: list[str]) -> Killable:
            return Killable(name, log)

    stack = Stack_("127.0.0.1:1", "ns", [PoolSpec("h100", 1)], tmp_path, with_router=False)
    stack.start()
    assert stack.stop() == []
    with pytest.raises(RuntimeError, match="the stack is stopping: worker-0 is not started"):
        stack.restart("worker-0")
    with pytest.raises(RuntimeError, match="stopping"):
        stack.add_worker(PoolSpec("h100", 1))
    assert [proc.returncode for proc in stack.processes.values()] == [0]  # as stopped

def test_a_draining_worker_does_not_count_and_is_stopped_once(tmp_path) -> None:
    pool = PoolSpec("h100", 3)
    stack = _Stack("127.0.0.1:1", "ns", [pool], tmp_path)
    stack.start()
    stack.scale(pool, 2)  # worker-2 drains
    assert stack.workers_of(pool.name) == [0, 1]
    stack.scale(pool, 2)  # restated: nothing to do, and no second SIGTERM
    assert len(stack.processes["worker-2"].signals) == 1
    stack.scale(pool, 3)  # back to 3 while worker-2 still drains: a new worker serves
    assert stack.workers_of(pool.name) == [0, 1, 3]
    stack.processes["worker-2"].returncode = 0  # it has finished and exited
    assert stack.workers_of(pool.name) == [0, 1, 3]
    stack.respawn("worker-2")  # a worker started on the slot again serves
    assert stack.workers_of(pool.name) == [0, 1, 2, 3]


def test_the_running_workers_are_those_whose_processes_run(tmp_path) -> None:
    a100, h100 = PoolSpec("a100", 1), PoolSpec("h100", 2)
    stack = _Stack("127.0.0.1:1", "ns", [a100, h100], tmp_path)
    stack.start()
    stack.processes["worker-1"].returncode = 1  # (crashed)
    assert stack.running_workers() == {0: a100.name, 2: h100.name}


def test_scaling_in_drains_the_newest_worker_not_the_highest_slot(tmp_path) -> None:
    """A worker started on a lower slot another pool freed is the pool's newest (cold, loading,
    holding nothing): a cut drains it, not a warm worker serving on a higher slot (``governor
    up --fleet a100:1,h100:2``: a100 cut to 0, h100 raised to 3 on slot 0, then cut to 2
    drained worker-2, warm, and kept worker-0 loading)."""
    a100, h100 = PoolSpec("a100", 1), PoolSpec("h100", 2)
    stack = _Stack("127.0.0.1:1", "ns", [a100, h100], tmp_path, with_router=False)
    stack.start()
    stack.scale(a100, 0)  # worker-0 drains, then exits
    stack.processes["worker-0"].returncode = 0
    assert stack.add_worker(h100, cold=True) == 0  # (as scale(h100, 3) does: the lowest free)
    stack.scale(h100, 2)
    assert stack.workers_of(h100.name) == [1, 2]
    assert stack.processes["worker-0"].signals and not stack.processes["worker-2"].signals


def test_a_crashed_worker_to_be_started_again_keeps_its_place_in_its_pool(tmp_path) -> None:
    """A worker that crashed waits out its restart backoff: a restatement of its pool's size
    meanwhile started a cold worker on another slot, and ``revive`` the crashed one too, one
    worker too many until the next restatement drained one. A cut drains the crashed one
    first: it is not started again."""
    import time

    pool = PoolSpec("h100", 3)
    stack = _Stack("127.0.0.1:1", "ns", [pool], tmp_path, with_router=False,
                   revives_workers=True)  # (as governor up's: it calls revive)
    stack.start()
    stack.processes["worker-1"].returncode = -9  # crashed
    assert stack.workers_of(pool.name) == [0, 1, 2]
    stack.scale(pool, 3)  # restated meanwhile: nothing to add
    assert sorted(stack.processes) == ["worker-0", "worker-1", "worker-2"]
    assert stack.revive(now=time.monotonic() + 3_600) == {"worker-1": -9}
    assert stack.workers_of(pool.name) == [0, 1, 2]
    stack.processes["worker-2"].returncode = -9  # crashed again, elsewhere; then a cut
    stack.scale(pool, 2)
    assert stack.workers_of(pool.name) == [0, 1]
    assert not stack.processes["worker-0"].signals and not stack.processes["worker-1"].signals
    assert stack.revive(now=time.monotonic() + 7_200) == {}  # the cut took the crashed one
    # a stack that does not start crashed workers again (governor demo's: its faults kill and
    # start them) counts a crashed worker out, and a restatement replaces it
    demo = _Stack("127.0.0.1:1", "ns", [pool], tmp_path, with_router=False)
    demo.start()
    demo.processes["worker-1"].returncode = -9
    assert demo.workers_of(pool.name) == [0, 2]
    demo.scale(pool, 3)
    assert demo.workers_of(pool.name) == [0, 1, 2] and demo.running("worker-1")


def test_a_worker_drained_leaves_no_restart_backoff_to_its_slots_next_worker(tmp_path,
                                                                             monkeypatch) -> None:
    """A worker that drained (exit 0) is not started again, and its exit is no crash: the
    worker started on its slot later, crashing, is started again after a backoff of its own.
    Before 7 Dec ``revive`` counted the drained worker's exit into the slot's backoff at each
    of its calls (1 s, 2 s, ... up to 60 s): the next worker on the slot, crashed 5 s after
    its start, waited out what was left of that (here 25 s, not 1 s), and one crashed after a
    stable run and again at once waited 60 s, not 1 s, its pool a worker short meanwhile."""
    import types

    from infra import stack as stack_module

    clock = [0.0]
    monkeypatch.setattr(stack_module, "time", types.SimpleNamespace(
        monotonic=lambda: clock[0], time=lambda: 1_000.0 + clock[0]))
    pool = PoolSpec("h100", 1)
    stack = _Stack("127.0.0.1:1", "ns", [pool], tmp_path, with_router=False,
                   revives_workers=True)
    stack.start()  # worker-0, at 0 s
    clock[0] = 10.0
    stack.scale(pool, 0)  # drained on a command: it exits 0
    stack.processes["worker-0"].returncode = 0
    while clock[0] < 45.0:  # governor up's loop, every half second
        assert stack.revive(now=clock[0]) == {}
        clock[0] += 0.5
    stack.scale(pool, 1)  # at 45 s: a new worker on slot 0
    first = stack.processes["worker-0"]
    assert first.returncode is None
    clock[0] = 50.0
    first.returncode = -9  # crashed 5 s after its start: its first crash, after 1 s
    assert stack.revive(now=50.0) == {}
    assert stack.revive(now=51.0) == {"worker-0": -9}
    clock[0] = 200.0  # the revived one ran stably, then crashed: at once
    stack.processes["worker-0"].returncode = -9
    assert stack.revive(now=200.0) == {"worker-0": -9}
    clock[0] = 201.0  # and again 1 s later: after 1 s
    stack.processes["worker-0"].returncode = -9
    assert stack.revive(now=201.0) == {}
    assert stack.revive(now=202.0) == {"worker-0": -9}
    # A crashed worker cut while it waits to be started again: the worker started on its slot
    # after it inherits no restart time of its (one already past: the backoff not reset)
    clock[0] = 300.0
    stack.processes["worker-0"].returncode = -9  # (1 s again: it started at 202)
    assert stack.revive(now=300.0) == {"worker-0": -9}
    clock[0] = 300.5
    stack.processes["worker-0"].returncode = -9
    assert stack.revive(now=300.5) == {}  # to be started again at 302.5 (2 s)
    stack.scale(pool, 0)  # the cut takes the crashed one
    stack.scale(pool, 1)  # a new worker on slot 0, at 300.5
    clock[0] = 400.0  # stable, then crashed: at once; and again 1 s later: after 1 s
    stack.processes["worker-0"].returncode = -9
    assert stack.revive(now=400.0) == {"worker-0": -9}
    clock[0] = 401.0
    stack.processes["worker-0"].returncode = -9
    assert stack.revive(now=401.0) == {}
    assert stack.revive(now=402.0) == {"worker-0": -9}


def test_a_worker_drained_on_a_command_is_not_reported_as_exited(tmp_path) -> None:
    pool = PoolSpec("h100", 2)
    stack = _Stack("127.0.0.1:1", "ns", [pool], tmp_path, with_router=False)
    stack.start()
    stack.scale(pool, 1)  # worker-1 drains, then exits as told
    stack.processes["worker-1"].returncode = 0
    assert stack.dead() == []
    stack.processes["worker-0"].returncode = -9  # killed: that one is reported
    assert stack.dead() == ["worker-0"]


def _scale(pool: str, gpu: str, model: str, replicas: int):
    from schemas.commands import ScalePool

    return ScalePool(event_time_ms=1, command_id="c", issued_by="t", pool=pool, gpu_type=gpu,
                     model=model, replicas=replicas, reason="t")


def test_the_supervisor_refuses_a_size_the_local_stack_cannot_give(tmp_path) -> None:
    from infra.supervisor import _cannot

    stack = _Stack("127.0.0.1:1", "ns", [PoolSpec("h100", 4), PoolSpec("a100", 2)], tmp_path)
    stack.start()
    ok = _scale("h100@llama-3-8b", "h100", "llama-3-8b", 30)
    assert _cannot(ok, stack, 32) is None  # 30 + the 2 of a100
    assert "31 workers beside the 2 slots other workers hold (a draining one until it exits) " \
        "pass the 32 a local stack has" in _cannot(
            _scale("h100@llama-3-8b", "h100", "llama-3-8b", 31), stack, 32)
    one_other = _Stack("127.0.0.1:1", "ns", [PoolSpec("h100", 1), PoolSpec("a100", 2)],
                       tmp_path / "one")
    one_other.start()
    assert "32 workers beside the 1 slot another worker holds (a" in _cannot(
        _scale("a100@llama-3-8b", "a100", "llama-3-8b", 32), one_other, 32)
    assert "unknown" in _cannot(_scale("b200@llama-3-8b", "b200", "llama-3-8b", 1), stack, 32)
    stack.scale(PoolSpec("h100", 1), 1)  # three h100 workers drain: they hold their slots
    assert "pass the 32" in _cannot(ok, stack, 32)
    assert _cannot(_scale("h100@llama-3-8b", "h100", "llama-3-8b", 27), stack, 32) is None
    assert "its name is not" in _cannot(_scale("h100@x", "h100", "llama-3-8b", 1), stack, 32)


def test_the_supervisor_refuses_a_model_or_gpu_named_in_another_letter_case(tmp_path) -> None:
    """Looked up in any case, they passed: it started workers whose ``governor worker`` refuses
    the model's spelling at start (exiting at once, started again and again), or named a pool
    ``H100@...`` whose workers heart-beat as ``h100@...``. ``governor command`` refuses both;
    a command written otherwise (by hand, or an ``autoscaler.pools`` entry) is refused here."""
    from infra.supervisor import _cannot

    stack = _Stack("127.0.0.1:1", "ns", [PoolSpec("h100", 1)], tmp_path)
    stack.start()
    assert _cannot(_scale("h100@Llama-3-8B", "h100", "Llama-3-8B", 1), stack, 32) == (
        "model 'Llama-3-8B' is named 'llama-3-8b': a pool serves the requests that name its "
        "model exactly")
    assert _cannot(_scale("H100@llama-3-8b", "H100", "llama-3-8b", 1), stack, 32) == (
        "gpu 'H100' is named 'h100'")
    assert _cannot(_scale("h100@llama-3-8b", "h100", "llama-3-8b", 1), stack, 32) is None


def test_the_supervisor_takes_a_fetchs_last_command_per_pool_and_says_a_refusal_once(
        tmp_path) -> None:
    from infra.supervisor import carry_out

    stack = _Stack("127.0.0.1:1", "ns", [PoolSpec("h100", 1)], tmp_path)
    stack.start()
    said: list[str] = []
    refused: dict = {}
    carry_out([_scale("h100@llama-3-8b", "h100", "llama-3-8b", 3),
               _scale("h100@llama-3-8b", "h100", "llama-3-8b", 1)], stack, 32, refused, said.append)
    assert stack.workers_of("h100@llama-3-8b") == [0]  # 3 was out of date: nothing started
    assert not any(name.startswith("worker-1") for name in stack.processes)
    carry_out([_scale("h100@llama-3-8b", "h100", "llama-3-8b", 2)], stack, 32, refused,
              said.append)
    assert stack.workers_of("h100@llama-3-8b") == [0, 1]
    for _ in range(3):  # restated: refused, said once, nothing started
        carry_out([_scale("b200@llama-3-8b", "b200", "llama-3-8b", 1)], stack, 32, refused,
                  said.append)
    assert [s for s in said if s.startswith("b200")] == [s for s in said if "not scaled" in s]
    assert len([s for s in said if "not scaled" in s]) == 1
    assert not any("b200" in " ".join(args) for args in stack.args.values())


def test_the_supervisor_says_each_command_it_cannot_carry_out_once_while_it_asks_the_same(
        tmp_path) -> None:
    """An operator's ``scale_pool`` to 40, then to 50, after the autoscaler's restatements of
    40: each is said (and returned, which the supervisor dead-letters for ``governor report
    actions``). Before, a pool refused once was never said again, so the 50 went unsaid."""
    from infra.supervisor import carry_out

    stack = _Stack("127.0.0.1:1", "ns", [PoolSpec("h100", 1)], tmp_path)
    stack.start()
    refused: dict = {}
    pool = "h100@llama-3-8b"
    said = [carry_out([_scale(pool, "h100", "llama-3-8b", replicas)], stack, 32, refused)
            for replicas in (40, 40, 40, 50, 1, 40)]
    assert [[(c.replicas, "pass the 32" in why) for c, why in s] for s in said] == [
        [(40, True)], [], [], [(50, True)], [], [(40, True)]]  # (1 runs: 40 is new again)


def test_a_cut_drains_a_worker_behind_an_open_breaker_first(tmp_path) -> None:
    """The autoscaler replaces a worker out of service and then asks for one less: the
    supervisor drains that worker (its breaker open, read from the control topic), not the
    newest, which serves."""
    from infra.supervisor import carry_out
    from schemas.commands import SetBreakerState

    pool = PoolSpec("h100", 2)
    stack = _Stack("127.0.0.1:1", "ns", [pool], tmp_path, with_router=False)
    stack.start()
    breakers: dict[str, str] = {}
    opened = SetBreakerState(event_time_ms=1, command_id="b", issued_by="t", worker_id="worker-0",
                             state="open", reason="t")
    carry_out([opened, _scale(pool.name, "h100", "llama-3-8b", 3)], stack, 32, {},
              breakers=breakers)
    assert stack.workers_of(pool.name) == [0, 1, 2]
    carry_out([_scale(pool.name, "h100", "llama-3-8b", 2)], stack, 32, {}, breakers=breakers)
    assert stack.workers_of(pool.name) == [1, 2]
    assert stack.processes["worker-0"].signals and not stack.processes["worker-2"].signals


def test_each_component_gets_its_own_metrics_port(tmp_path):
    stack = Stack("b", "ns", [PoolSpec("h100", 2)], tmp_path, metrics_port=9100)
    assert stack.metrics_ports(2) == {"router": 9100, "controllers": 9101, "streams": 9102,
                                      "sink": 9103, "worker-0": 9110, "worker-1": 9111}
    assert stack._metrics_args("worker-7") == ["--metrics-port", "9117"]  # (one added later)
    assert stack._metrics_args("controllers") == ["--metrics-port", "9101"]
    assert stack._metrics_args("sink") == ["--metrics-port", "9103"]
    off = Stack("b", "ns", [PoolSpec("h100", 2)], tmp_path)
    assert off.metrics_ports(2) == {} and off._metrics_args("router") == []


def test_the_router_gets_the_stacks_router_options(tmp_path, monkeypatch):
    """`governor up --no-worker-wait-s` reaches the router it starts."""
    from types import SimpleNamespace

    stack = Stack("b", "ns", [PoolSpec("h100", 0)], tmp_path,
                  router_args=("--no-worker-wait-s", "90"))
    monkeypatch.setattr(stack, "_start_process", lambda name, args: SimpleNamespace(pid=1))
    stack.start()
    assert stack.args["router"] == ["router", "--bootstrap", "b", "--namespace", "ns",
                                    "--no-worker-wait-s", "90"]
    assert "--no-worker-wait-s" not in stack.args["controllers"]


def test_a_stack_of_vllm_servers_gives_each_worker_its_own_and_is_not_scaled(tmp_path) -> None:
    """`governor up --vllm-url URL ...`: the worker on slot N runs --engine vllm against the
    N-th server (a vLLM-shaped fleet was started component by component); the autoscaler's
    ScalePool is refused, said why, as the stack cannot start or stop servers."""
    from infra.supervisor import _cannot

    urls = ("http://127.0.0.1:8000", "http://127.0.0.1:8001", "http://127.0.0.1:8002")
    stack = _Stack("127.0.0.1:1", "ns", [PoolSpec("h100", 2), PoolSpec("a100", 1)], tmp_path,
                   vllm_urls=urls)
    stack.start()
    for slot, url in enumerate(urls):
        args = stack.args[f"worker-{slot}"]
        assert args[args.index("--engine"):args.index("--engine") + 4] == [
            "--engine", "vllm", "--vllm-url", url]
    assert "vLLM servers (--vllm-url)" in _cannot(
        _scale("h100@llama-3-8b", "h100", "llama-3-8b", 1), stack, 32)
    with pytest.raises(ValueError, match="no vLLM server for a worker on slot 3"):
        stack.add_worker(PoolSpec("h100", 1))


@pytest.mark.parametrize("args, said", [
    (["--fleet", "h100:2", "--vllm-url", "http://127.0.0.1:8000"],
     "--vllm-url is given once, but --fleet h100:2 has 2 workers (h100@llama-3-8b: 2 GPUs at 1 "
     "a worker): give each worker a server"),
    (["--fleet", "h100:1", "--vllm-url", "http://127.0.0.1:8000", "--vllm-url",
      "http://127.0.0.1:8001"],
     "--vllm-url is given 2 times, but --fleet h100:1 has 1 worker (h100@llama-3-8b: 1 GPU at 1 "
     "a worker): give each worker a server"),
    # a pool's count is GPUs: two servers of two H100s each for Llama-2-70B (before 6 Dec,
    # two servers of one, each billed one GPU)
    (["--fleet", "h100:2@llama-2-70b", "--vllm-url", "http://127.0.0.1:8000", "--vllm-url",
      "http://127.0.0.1:8001"],
     "--vllm-url is given 2 times, but --fleet h100:2@llama-2-70b has 1 worker "
     "(h100@llama-2-70b: 2 GPUs at 2 a worker): give each worker a server"),
    (["--fleet", "h100:4/tp4@llama-2-70b", "--vllm-url", "http://127.0.0.1:8000",
      "--vllm-url", "http://127.0.0.1:8001"],
     "--vllm-url is given 2 times, but --fleet h100:4/tp4@llama-2-70b has 1 worker "
     "(h100@llama-2-70b: 4 GPUs at 4 a worker): give each worker a server"),
    (["--fleet", "h100:3@llama-2-70b", "--vllm-url", "http://127.0.0.1:8000"],
     "pool h100@llama-2-70b: llama-2-70b runs on 2 h100 GPUs a worker (the least tensor "
     "parallelism that holds it), and 3 GPUs is not a multiple of 2"),
    (["--fleet", "h100:1", "--vllm-url", "127.0.0.1:8000"],
     "--vllm-url must be the server's http:// or https:// URL, got '127.0.0.1:8000' "
     "(http://127.0.0.1:8000?)"),
])
def test_up_checks_its_vllm_servers_before_it_starts_anything(tmp_path, monkeypatch, args,
                                                              said) -> None:
    from typer.testing import CliRunner

    import infra.cli as cli
    from schemas.errors import GovernorError

    def no_broker(*args, **kwargs):
        raise AssertionError("reached for a broker before the input was checked")

    monkeypatch.setattr(cli, "_kafka", no_broker)
    result = CliRunner().invoke(cli.app, ["up", "--log-dir", str(tmp_path / "logs"),
                                          "--data-dir", str(tmp_path / "data"), *args])
    assert isinstance(result.exception, GovernorError), result.output  # (exit 2, `run`)
    assert said in str(result.exception)


def test_a_vllm_stack_says_nothing_of_a_size_it_already_has(tmp_path) -> None:
    """The autoscaler restates each pool's size every 5 s: a vLLM stack's supervisor said it
    leaves the pool as it is (its workers are servers) where nothing was asked."""
    from infra.supervisor import carry_out

    stack = _Stack("127.0.0.1:1", "ns", [PoolSpec("h100", 1)], tmp_path,
                   vllm_urls=("http://127.0.0.1:8000",))
    stack.start()
    said: list[str] = []
    carry_out([_scale("h100@llama-3-8b", "h100", "llama-3-8b", 1)], stack, 32, {}, said.append)
    assert said == []
    carry_out([_scale("h100@llama-3-8b", "h100", "llama-3-8b", 2)], stack, 32, {}, said.append)
    assert said == ["h100@llama-3-8b: not scaled (its workers are vLLM servers (--vllm-url), "
                    "which the local stack does not start or stop)"]


def test_the_controllers_are_told_when_the_stacks_fleet_started(tmp_path, monkeypatch) -> None:
    """A pool size an earlier stack's autoscaler commanded within 30 s of this start (a 0, say)
    is not continued from (``Autoscaler.fleet_started_ms``): the ``--fleet`` just typed stands.
    A controllers process started again later is told the same start."""
    import time

    from typer.testing import CliRunner

    from controllers.service import ControllersService
    from infra import cli

    before = int(time.time() * 1000)
    stack = _Stack("127.0.0.1:1", "ns", parse_fleet("h100:1"), tmp_path)
    stack.start()
    args = stack.args["controllers"]
    started_ms = int(args[args.index("--fleet-started-ms") + 1])
    assert before <= started_ms <= int(time.time() * 1000)
    stack.processes["controllers"].returncode = 1  # crashed: started again, as it was
    stack.revive(now=time.monotonic() + 60)
    assert stack.args["controllers"] == args
    services: list[ControllersService] = []
    monkeypatch.setattr(cli, "_with_topics", lambda bootstrap, catalog: bootstrap)
    monkeypatch.setattr(cli, "_run_until_signalled", lambda make: services.append(make()))
    result = CliRunner().invoke(cli.app, args)  # the command line the stack runs
    assert result.exit_code == 0, result.output
    assert services[0].autoscaler.fleet_started_ms == started_ms


def _supervise(stack: Stack, monkeypatch, batches: list[list], letters: list[str],
               on_fetch=lambda left: None) -> None:
    """``infra.supervisor.supervise`` of ``stack`` over ``batches`` of commands, one a fetch of
    the control topic, stopped after the last (within 10 s); the details of what it
    dead-letters into ``letters``; ``on_fetch(batches left)`` before each fetch."""
    import asyncio
    import contextlib
    from types import SimpleNamespace

    import infra.supervisor as supervisor
    from infra.bus import Decoded
    from schemas.topics import TopicCatalog

    stop = asyncio.Event()

    class Control:  # (the control topic as the supervisor reads it)
        async def fetch(self, timeout_ms: int) -> list:
            on_fetch(len(batches))
            batch = batches.pop(0)
            if not batches:
                stop.set()
            return [Decoded(SimpleNamespace(offset=0), command) for command in batch]

        async def dead_letter(self, bad) -> None:
            letters.extend(exc.detail for _, exc in bad)

        def take_dead_lettered(self) -> list:
            return []

    @contextlib.asynccontextmanager
    async def reading(*args):
        yield Control()

    monkeypatch.setattr(supervisor, "reading", reading)
    asyncio.run(asyncio.wait_for(
        supervisor.supervise(stack, "127.0.0.1:1", TopicCatalog("ns"), stop), 10))


def test_the_supervisor_reads_for_a_model_declared_just_after_a_read_for_another(
        tmp_path, monkeypatch) -> None:
    """A ``scale_pool`` of a model nobody declared (the supervisor reads the configuration for
    it, in vain), then one of a model declared meanwhile, within ``REREAD_MODELS_S``: the second
    was refused as unknown, though ``governor command`` had read it declared. Only a model the
    last read did not find waits for the next read."""
    import infra.supervisor as supervisor
    from schemas.config import GovernorConfig

    declared: dict = {}
    reads, letters = [], []

    async def current_config(bootstrap, catalog, refuse=True):
        reads.append(catalog.namespace)
        return GovernorConfig.model_validate({"models": declared})

    def declare_after_the_first_read(left: int) -> None:
        if left == 2:
            declared["mine-13b"] = {
                "params_b": 13.0, "n_layers": 40, "n_heads": 40, "n_kv_heads": 40,
                "head_dim": 128, "hidden_size": 5120, "intermediate_size": 13824,
                "vocab_size": 32000}

    monkeypatch.setattr(supervisor, "current_config", current_config)
    monkeypatch.setattr("time.monotonic", lambda: 1_000.0)  # (time stands still)
    stack = _Stack("127.0.0.1:1", "ns", [PoolSpec("h100", 1)], tmp_path, with_router=False)
    stack.start()
    try:
        _supervise(stack, monkeypatch, [[_scale("h100@mine-31b", "h100", "mine-31b", 1)],
                                        [_scale("h100@mine-13b", "h100", "mine-13b", 1)],
                                        [_scale("h100@mine-31b", "h100", "mine-31b", 2)]],
                   letters, on_fetch=declare_after_the_first_read)
    finally:
        models.configure_models({})
    assert [letter.split(":")[0] for letter in letters] == [
        "supervisor leaves h100@mine-31b as it is"] * 2, letters
    assert len(stack.workers_of("h100@mine-13b")) == 1 and reads == ["ns", "ns"]


@pytest.mark.parametrize("read", ["fails", "does not answer"])
def test_a_supervisor_whose_read_of_the_declared_models_fails_goes_on(tmp_path, monkeypatch,
                                                                       read: str) -> None:
    """A ``scale_pool`` of a model the supervisor does not know reads the configuration; a read
    that fails (the broker away) or does not answer within ``READ_MODELS_S`` leaves the model
    unknown, the command refused (dead-lettered), and the supervision goes on. Before 7 Dec the
    error ended ``supervise`` (``governor up``'s fleet no longer followed its commands), and a
    read that did not answer held it."""
    import asyncio

    from aiokafka.errors import KafkaConnectionError

    import infra.supervisor as supervisor

    letters: list[str] = []

    async def current_config(bootstrap, catalog, refuse=True):
        if read == "fails":
            raise KafkaConnectionError("the broker went away")
        await asyncio.Event().wait()

    monkeypatch.setattr(supervisor, "current_config", current_config)
    monkeypatch.setattr(supervisor, "READ_MODELS_S", 0.05, raising=False)
    stack = _Stack("127.0.0.1:1", "ns", [PoolSpec("h100", 1)], tmp_path, with_router=False)
    stack.start()
    _supervise(stack, monkeypatch, [[_scale("h100@mine-13b", "h100", "mine-13b", 1)],
                                    [_scale("h100@llama-3-8b", "h100", "llama-3-8b", 2)]],
               letters)
    assert [letter.split(":")[0] for letter in letters] == [
        "supervisor leaves h100@mine-13b as it is"], letters
    assert len(stack.workers_of("h100@llama-3-8b")) == 2  # (the next command carried out)
