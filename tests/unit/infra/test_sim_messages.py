"""The simulator's unvalidated message builders make what pydantic's ``model_construct`` makes."""

from infra.sim.messages import Template, construct
from schemas.events import WorkerStatus

SHARED = dict(worker_id="w3", slot=3, pool="h100@llama-3-8b", gpu_type="h100", started_ms=0)
VARYING = dict(event_time_ms=1_500, models_loaded=["llama-3-8b"], state="warm", running=2,
               waiting=1, kv_blocks_used=40, itl_ms=None)


def test_construct_and_a_template_make_model_construct_s_instance() -> None:
    expected = WorkerStatus.model_construct(**SHARED, **VARYING)
    by_template = Template(WorkerStatus, **SHARED)(**VARYING)
    for made in (construct(WorkerStatus, **SHARED, **VARYING), by_template):
        assert made == expected
        assert made.model_dump() == expected.model_dump()
        assert made.model_fields_set == expected.model_fields_set == set(SHARED) | set(VARYING)
        WorkerStatus.model_validate(made.model_dump())  # and it is a valid heartbeat


def test_template_messages_share_no_mutable_state() -> None:
    template = Template(WorkerStatus, **SHARED)
    first, second = template(**VARYING), template(**{**VARYING, "running": 9})
    assert (first.running, second.running) == (2, 9)
    assert first.model_fields_set is not second.model_fields_set
    assert first.__dict__ is not second.__dict__
