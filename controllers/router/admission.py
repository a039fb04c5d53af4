"""Admission: the checks a request passes before it is queued. Pure: time is passed in."""

from dataclasses import dataclass

from schemas.events import RejectReason
from schemas.requests import InferenceRequest


@dataclass(frozen=True, slots=True)
class Denial:
    reason: RejectReason
    detail: str
    retry_after_s: float | None = None


def admit(request: InferenceRequest, now_ms: int) -> Denial | None:
    """None when the request may be queued, else why not."""
    if request.deadline_ms is not None and request.deadline_ms <= now_ms:
        late_s = (now_ms - request.deadline_ms) / 1000
        return Denial("deadline_unreachable", f"deadline passed {late_s:.3f}s before admission")
    return None
