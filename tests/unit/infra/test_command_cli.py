"""``governor command``'s commands: what is sent for what an operator types."""

from infra.command_cli import operator_command
from schemas.commands import DrainWorker, SetAdmissionLimits, target

NOW = 1_700_000_000_000


def test_a_command_is_stamped_named_and_keyed_by_its_target() -> None:
    drain = operator_command("drain-worker", '{"worker_id": "worker-3"}', reason="maintenance",
                             issued_by="alice", now_ms=NOW)
    assert isinstance(drain, DrainWorker)
    assert (drain.worker_id, drain.event_time_ms, drain.issued_by, drain.reason) == (
        "worker-3", NOW, "alice", "maintenance")
    assert (drain.command_id, target(drain)) == (f"drain_worker-worker-3-{NOW}", "worker-3")
    limits = operator_command("set_admission_limits",
                              '{"limits": {"acme": {"requests_per_s": 5, "tokens_per_s": 1e4}}}',
                              reason="", issued_by="operator", now_ms=NOW)
    assert isinstance(limits, SetAdmissionLimits) and limits.limits["acme"].requests_per_s == 5
    assert target(limits) == "set_admission_limits"  # (the whole fleet's: keyed by its type)
    assert limits.command_id == f"set_admission_limits-{NOW}"
