"""Multi-step workflows from ShareGPT conversations: a conversation is a task, its turns are steps.

Data: ``shared/data/traces/sharegpt_lengths/sharegpt_v3_turn_lengths_cl100k.csv`` (per turn: user,
assistant and history token counts of 9,460 conversations; no text).

How a workload is built (deterministic per ``seed``):
- tasks start at the arrivals of an arrival process: the Azure conversation trace's timestamps
  (default), a ServeGen tenant mix (``infra.workloads.servegen``) or a Poisson process, each
  divided by ``rate_scale``; only starts within ``duration_s`` are kept;
- each start takes the next conversation of a seeded shuffle; turn k (k = 0..) is step k+1: its
  prompt re-sends the whole history (``history_tokens_before_turn + user_tokens``), its output is
  the assistant's reply. Turns stop at ``max_turns`` or before a prompt over
  ``max_prompt_tokens`` (the model's context);
- the prompt's ``hash_ids`` are the conversation's blocks of ``block_size`` tokens: block j of
  conversation c is the same content in every later turn (the history only grows), so a worker
  that served turn k holds turn k+1's prefix (under ``governor sim`` its answer's blocks too,
  whose ids the simulator reads from turn k+1's: ``infra.sim.requests.answer_hashes``);
- step k+1 is written ``0.5 s + 0.025 s x output_tokens(k) + Exp(think_time_s)`` after step k
  (the middle term is a typical response time, the last the user's or the tool's time). A replay
  file cannot wait for completions, so ``replay`` and ``demo`` send it then; ``governor sim``
  sends it no earlier than the end of step k, and its ``--rate-scale`` moves task starts only
  (``infra.sim.arrivals``);
- tenant ``sharegpt``, priority 0, task id ``conv-<conversation>``, no SLOs (simulator defaults).
"""

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from infra.traces import TraceError, TraceRequest
from infra.traces.loaders import count_cell
from infra.workloads.servegen import MAX_REQUESTS

FILE = Path("sharegpt_lengths") / "sharegpt_v3_turn_lengths_cl100k.csv"
#: The counts read of each turn, in the order ``load_conversations`` keeps them.
COLUMNS = ("turn", "history_tokens_before_turn_cl100k", "user_tokens_cl100k",
           "assistant_tokens_cl100k")
RESPONSE_BASE_S, RESPONSE_PER_TOKEN_S = 0.5, 0.025


def load_conversations(traces_dir: Path) -> list[tuple[str, list[tuple[int, int, int]]]]:
    """``[(conversation_id, [(history, user, assistant) per turn])]`` in file order."""
    path = Path(traces_dir) / FILE
    if not path.exists():
        raise TraceError(f"ShareGPT turn lengths not found: {path}")
    convs: dict[str, list[tuple[int, int, int, int]]] = {}
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            rows = csv.DictReader(fh)
            missing = [name for name in ("conversation_id", *COLUMNS)
                       if name not in (rows.fieldnames or ())]
            if missing:
                raise TraceError(f"{path} line 1: the header lacks {', '.join(missing)}")
            for row in rows:  # (a cell a short row lacks is None: named as a bad value)
                where = f"{path} line {rows.line_num}"
                convs.setdefault(row["conversation_id"], []).append(tuple(
                    count_cell(where, name, row[name]) for name in COLUMNS))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"cannot read ShareGPT turn lengths {path}: {exc}") from None
    return [(cid, [(h, u, a) for _, h, u, a in sorted(turns)]) for cid, turns in convs.items()]


def sharegpt_workflows(traces_dir: Path, starts: Sequence[float], *, seed: int = 0,
                       max_turns: int = 12, max_prompt_tokens: int = 32_768,
                       think_time_s: float = 3.0, block_size: int = 64) -> list[TraceRequest]:
    """Tasks starting at ``starts`` (seconds); see the module docstring."""
    if block_size % 16:
        raise TraceError("block_size must be a multiple of 16 (the engine's KV block)")
    convs = load_conversations(traces_dir)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(convs))
    # (each conversation's steps, worked out once: for the size check and for the tasks)
    steps_of = [_steps(turns, max_turns, max_prompt_tokens) for _, turns in convs]
    _check_size(steps_of, order, len(starts))
    out: list[TraceRequest] = []
    for n, start in enumerate(sorted(starts)):
        index = int(order[n % len(order)])
        cid, steps = convs[index][0], steps_of[index]
        task = f"conv-{cid}-{n}"
        # hash ids of conversation `index`: base + block; each pass over the conversations
        # (more tasks than there are) is new content, sharing no prefix with the one before
        base = (n // len(order) * len(order) + index + 1) * 1_000_000
        t = float(start)
        for k, (prompt, output) in enumerate(steps):
            out.append(TraceRequest(
                arrival_s=round(t, 6), prompt_tokens=prompt, output_tokens=output,
                hash_ids=tuple(range(base, base + prompt // block_size)), block_size=block_size,
                tenant="sharegpt", task_id=task, step=k + 1, steps_total=len(steps)))
            t += RESPONSE_BASE_S + RESPONSE_PER_TOKEN_S * output + float(rng.exponential(think_time_s))
    out.sort(key=lambda r: (r.arrival_s, r.task_id, r.step))
    return out


def _steps(turns: list[tuple[int, int, int]], max_turns: int,
           max_prompt_tokens: int) -> list[tuple[int, int]]:
    """``(prompt, output)`` tokens of each step of a conversation's task: its turns, at most
    ``max_turns``, up to the first whose prompt is over ``max_prompt_tokens``."""
    steps = []
    for history, user, assistant in turns[:max_turns]:
        prompt = history + user
        if prompt > max_prompt_tokens:
            break
        steps.append((prompt, max(assistant, 1)))
    return steps


def _check_size(steps_of: list[list[tuple[int, int]]], order: np.ndarray, tasks: int) -> None:
    """A ``TraceError`` where ``tasks`` tasks, the conversations (of steps ``steps_of``) taken
    in ``order``, make more than ``MAX_REQUESTS`` requests (the workload is built in memory):
    before 7 Dec ShareGPT workloads had no bound, and a high start rate took every GB of the
    machine."""
    counts = [len(steps) for steps in steps_of]
    passes, rest = divmod(tasks, len(order))
    requests = passes * sum(counts) + sum(counts[int(i)] for i in order[:rest])
    if requests > MAX_REQUESTS:
        raise TraceError(f"ShareGPT: {tasks:,} tasks make {requests:,} requests, over the "
                         f"{MAX_REQUESTS:,} a workload holds; shorten --duration or lower the "
                         "task start rate (--mean-rps, --rate-scale)")


def poisson_starts(rate_rps: float, duration_s: float, seed: int = 0) -> list[float]:
    """Task starts of a Poisson process of ``rate_rps`` over ``duration_s``; a ``TraceError``
    where they are more than ``MAX_REQUESTS`` (each task is a request at least), before they
    are drawn."""
    if rate_rps * duration_s > MAX_REQUESTS:
        raise TraceError(f"ShareGPT with poisson arrivals: {duration_s:g} s at {rate_rps:,.1f} "
                         f"task starts/s is about {rate_rps * duration_s:,.0f} tasks, over the "
                         f"{MAX_REQUESTS:,} requests a workload holds; shorten --duration or set "
                         "a lower --mean-rps (or --rate-scale)")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_rps, size=int(rate_rps * duration_s * 2) + 16)
    times = np.cumsum(gaps)
    return [float(t) for t in times[times < duration_s]]
