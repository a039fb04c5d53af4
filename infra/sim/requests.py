"""From trace rows to what the simulator tracks (``RequestSpec``) and what it routes
(``InferenceRequest``): earliest arrival times, SLOs filled in from the default rule.

``rate_scale`` compresses the start of each task (and every request without a task id), not
the time between a task's steps: a step's offset from its task's first request keeps its size
in the trace, and the step is held until the previous step of its task has ended
(``previous_steps``, ``infra.sim.arrivals``). A conversation's next turn re-sends the answer
to the last one, so it cannot be sent before that answer is in, however hard the load is pushed;
its prefix hash ids name that answer's blocks, which the engine that generated it caches
(``answer_hashes``).
"""

import heapq
from collections.abc import Iterable, Iterator, Sequence

from infra.sim.messages import construct
from infra.sim.outcomes import RequestSpec
from infra.sim.slo import SloRule
from infra.traces import TraceRequest
from schemas.requests import InferenceRequest


def with_earliest(trace: Iterable[TraceRequest],
                  rate_scale: float) -> Iterator[tuple[TraceRequest, float]]:
    """Each request with its arrival before any wait for its task's previous step: its own
    arrival divided by ``rate_scale`` without a task id, else its task's start (the first of its
    requests in the trace) so divided plus its own offset from that start, unscaled. Streamed:
    ``governor replay --rate-scale`` gives its rows these times, as ``sim`` does."""
    starts: dict[tuple[str, str], float] = {}
    for r in trace:
        if r.task_id:
            start = starts.setdefault((r.tenant, r.task_id), r.arrival_s)
            yield r, start / rate_scale + (r.arrival_s - start)
        else:
            yield r, r.arrival_s / rate_scale


def earliest_arrivals(trace: Iterable[TraceRequest], rate_scale: float) -> list[float]:
    """``with_earliest``'s times, in the trace's order."""
    return [due for _, due in with_earliest(trace, rate_scale)]


def in_arrival_order(trace: Iterable[TraceRequest],
                     rate_scale: float) -> Iterator[tuple[float, int, TraceRequest]]:
    """``(earliest arrival, index in the trace, request)`` in the order of those arrivals (at
    equal times the earlier row), as ``Arrivals`` releases requests that wait for none: a
    task's later step, its offset unscaled, may be due after rows below it. Streamed, holding
    only the rows not yet due: a row is given once no row below it can be due before it (a
    row arriving at ``a`` is due at ``a / rate_scale`` at the earliest, ``a`` below 1)."""
    pending: list[tuple[float, int, TraceRequest]] = []
    for i, (r, due) in enumerate(with_earliest(trace, rate_scale)):
        floor = r.arrival_s / rate_scale if rate_scale >= 1 else r.arrival_s
        while pending and pending[0][0] <= floor:
            yield heapq.heappop(pending)
        heapq.heappush(pending, (due, i, r))
    while pending:
        yield heapq.heappop(pending)


def previous_steps(trace: Sequence[TraceRequest]) -> list[int | None]:
    """For each request, the index of the step of its task it waits for: the latest request
    before it in the trace of the same task with a lower step (None: the task's first, a
    request without a task id)."""
    stacks: dict[tuple[str, str], list[tuple[int, int]]] = {}  # task -> (step, index), steps rising
    out: list[int | None] = []
    for i, r in enumerate(trace):
        if not r.task_id:
            out.append(None)
            continue
        stack = stacks.setdefault((r.tenant, r.task_id), [])
        while stack and stack[-1][0] >= r.step:  # (a repeated step waits for the one before it)
            stack.pop()
        out.append(stack[-1][1] if stack else None)
        stack.append((r.step, i))
    return out


def answer_hashes(trace: Sequence[TraceRequest],
                  previous: Sequence[int | None]) -> list[tuple[int, ...]]:
    """For each request, the hash ids of the blocks its answer fills (``EngineRequest.
    answer_hashes``), read from the next step of its task (the first that waits for it,
    ``previous``: ``previous_steps``' list): a trace's ``hash_ids`` are its prompt's, but a
    conversation's next turn re-sends the answer, and its ids name the blocks of prompt and
    answer together. Where the next step's ids begin with this request's full-prompt ids
    (``prompt_tokens // block_size`` of them, all there), its ids from that index on, up to
    the blocks the prompt and answer fill whole and no further than it has ids; else none (a
    next step that does not extend the prompt, the last step, a request without a task).
    Worked out once per trace: the engines are handed them with each dispatch."""
    out: list[tuple[int, ...]] = [()] * len(trace)
    seen: set[int] = set()
    for j, i in enumerate(previous):
        if i is None or i in seen:  # (of two steps waiting for one, the first is its next)
            continue
        seen.add(i)
        r, after = trace[i], trace[j]
        size = r.block_size
        full = r.prompt_tokens // size
        ids, later = r.hash_ids, after.hash_ids
        if after.block_size != size or len(ids) < full or later[:full] != ids[:full]:
            continue
        end = min((r.prompt_tokens + max(r.output_tokens, 1)) // size, len(later))
        if end > full:
            out[i] = tuple(later[full:end])
    return out


def request_specs(trace: Sequence[TraceRequest], rate_scale: float, slo: SloRule) -> list[RequestSpec]:
    out = []
    for i, (r, arrival) in enumerate(zip(trace, earliest_arrivals(trace, rate_scale))):
        output = max(r.output_tokens, 1)  # an engine always samples at least one token
        ttft, deadline = slo.targets(r.prompt_tokens, output, r.ttft_slo_s, r.deadline_s)
        out.append(RequestSpec(
            arrival_s=arrival, prompt_tokens=r.prompt_tokens, output_tokens=output,
            ttft_slo_s=ttft, deadline_s=deadline,
            task=(r.tenant, r.task_id) if r.task_id else ("", f"r{i}"),
            steps_total=r.steps_total if r.task_id else 1, step=r.step if r.task_id else 1))
    return out


def inference_request(i: int, r: TraceRequest, spec: RequestSpec, created_ms: int,
                      max_tokens: int | None = None, steps_known: bool = True,
                      stated_only: bool = False) -> InferenceRequest:
    """Request ``r{i}`` as a client would produce it at ``created_ms`` (virtual), asking for at
    most ``max_tokens`` (None: its answer's length, ``spec.output_tokens``; never less), and
    saying its task's ``steps_total`` if ``steps_known`` (else its own step). Its TTFT target
    and deadline are ``spec``'s, or with ``stated_only`` those its row states (none where it
    states none: ``SloRule.stated_only``), as ``replay`` sends it."""
    ttft, deadline_s = (r.ttft_slo_s, r.deadline_s) if stated_only else \
        (spec.ttft_slo_s, spec.deadline_s)
    return construct(
        InferenceRequest, request_id=f"r{i}", task_id=r.task_id, step=r.step,
        steps_total=r.steps_total if steps_known else r.step, tenant=r.tenant,
        priority=min(max(r.priority, 0), 9),
        model=r.model, prompt_tokens=r.prompt_tokens, prefix_hashes=list(r.hash_ids),
        block_size=r.block_size, max_tokens=max(spec.output_tokens, max_tokens or 0),
        ttft_slo_s=ttft,
        deadline_ms=None if deadline_s is None else created_ms + int(deadline_s * 1000),
        created_ms=created_ms)

