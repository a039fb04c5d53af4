"""Default latency targets for requests whose trace states none, and what counts as success.

Neither the Azure nor the Mooncake trace carries SLOs, so the simulator gives every request
without one (Governor JSONL may set ``ttft_slo_s`` and ``deadline_s`` per request):

    ttft_slo_s = ttft_base_s + ttft_per_1k_prompt_s * prompt_tokens / 1000
    deadline_s = ttft_slo_s + tpot_s * output_tokens            (both after the request's arrival)

or, with ``governor sim --deadlines config``, a flat ``slo.deadline_s`` (60 s by default) after
arrival, as the live stack judges a request that states no deadline. With ``--deadlines none`` a
request is sent with only the targets its row states, as a client that states none, and is judged
as the live streams judge such a request: its first token by ``slo.ttft_slo_s`` (flat, 2 s by
default), its end by ``slo.deadline_s`` after its arrival.

Defaults: 2 s (``GovernorConfig.slo.ttft_slo_s``) + 0.1 s per 1k prompt tokens, and 0.1 s per
output token (10 tokens/s, several times slower than any calibrated decode step). A flat 2 s TTFT
target would be unreachable for long prompts even on an idle GPU (a 64k-token prefill alone takes
2.7 s on an H100), so the target grows with the prompt: 100k tokens get 12 s (the isolated
prefill is 5.7 s).

- A request **succeeds** when it completes within its deadline (DESIGN.md); a task succeeds when
  every one of its requests does.
- A request **meets its SLO** when it succeeds and its first token came within ``ttft_slo_s``;
  ``slo_attainment`` is that share of *all* requests (rejected and failed ones count as misses).
"""

from dataclasses import dataclass

from schemas.config import SloConfig

#: The modes of ``--deadlines`` (``sim``, ``replay`` and ``demo``), the default first.
DEADLINES = ("rule", "config", "none")


@dataclass(frozen=True)
class SloRule:
    ttft_base_s: float = SloConfig().ttft_slo_s
    ttft_per_1k_prompt_s: float = 0.1
    tpot_s: float = 0.1
    #: Set: every deadline is this long after arrival instead, whatever the answer's length (the
    #: live stack's ``slo.deadline_s``, which the streams judge requests that state none by).
    flat_deadline_s: float | None = None
    #: True: the router is sent only the targets a request states (none where its row states
    #: none), as a client that states no deadline; the rule's targets only judge it.
    stated_only: bool = False

    def __post_init__(self) -> None:
        if self.ttft_base_s <= 0 or self.ttft_per_1k_prompt_s < 0 or self.tpot_s <= 0:
            raise ValueError("SLO rule: ttft_base_s and tpot_s must be > 0, the per-1k term >= 0")
        if self.flat_deadline_s is not None and not self.flat_deadline_s > 0:
            raise ValueError(f"SLO rule: flat_deadline_s must be > 0, got {self.flat_deadline_s}")

    @classmethod
    def configured(cls, slo: SloConfig, deadlines: str = "rule") -> "SloRule":
        """The rule from the ``slo`` settings: its TTFT base ``slo.ttft_slo_s``, and with
        ``deadlines`` ``"config"`` every deadline ``slo.deadline_s`` after arrival. What
        ``governor sim --deadlines`` judges by and gives the router, and what ``replay`` and
        ``demo --deadlines`` stamp on a row that states none (``infra.replay.as_simulated``),
        so the router sees the same targets live as simulated. ``"none"``: nothing is stamped
        (``stated_only``), and a request is judged as the live streams judge one that states
        no targets: by a flat ``slo.ttft_slo_s`` and ``slo.deadline_s``."""
        if deadlines not in DEADLINES:
            raise ValueError(f"deadlines must be one of {', '.join(DEADLINES)}, got {deadlines!r}")
        if deadlines == "none":
            return cls(ttft_base_s=slo.ttft_slo_s, ttft_per_1k_prompt_s=0.0,
                       flat_deadline_s=slo.deadline_s, stated_only=True)
        return cls(ttft_base_s=slo.ttft_slo_s,
                   flat_deadline_s=slo.deadline_s if deadlines == "config" else None)

    def ttft_slo_s(self, prompt_tokens: int) -> float:
        return self.ttft_base_s + self.ttft_per_1k_prompt_s * prompt_tokens / 1000

    def deadline_s(self, prompt_tokens: int, output_tokens: int, ttft_slo_s: float | None = None) -> float:
        if self.flat_deadline_s is not None:
            return self.flat_deadline_s
        ttft = self.ttft_slo_s(prompt_tokens) if ttft_slo_s is None else ttft_slo_s
        return ttft + self.tpot_s * output_tokens

    def targets(self, prompt_tokens: int, output_tokens: int, ttft_slo_s: float | None = None,
                deadline_s: float | None = None) -> tuple[float, float]:
        """``(ttft_slo_s, deadline_s)`` of a request: those it states, the rule's where it states
        none. A TTFT target is capped at the deadline: a first token due after the whole answer
        is no target (a trace row stating both so is refused, ``TraceRequest``). The cap cuts a
        rule target at a stated deadline, and any target at a ``flat_deadline_s`` (a row's own
        90 s against ``slo.deadline_s`` 60 s, as the live streams judge such a request: it
        meets its SLO only by completing within 60 s)."""
        ttft = ttft_slo_s or self.ttft_slo_s(prompt_tokens)
        deadline = deadline_s or self.deadline_s(prompt_tokens, output_tokens, ttft)
        return min(ttft, deadline), deadline

    def describe(self) -> str:
        if self.stated_only:
            return (f"only the targets a request states are sent; one that states none is "
                    f"judged by TTFT SLO {self.ttft_base_s:g} s (slo.ttft_slo_s) and deadline "
                    f"{self.flat_deadline_s:g} s after arrival (slo.deadline_s), as the live "
                    "streams judge it")
        deadline = (f"{self.flat_deadline_s:g} s after arrival (slo.deadline_s)"
                    if self.flat_deadline_s is not None
                    else f"TTFT SLO + {self.tpot_s:g} s per output token")
        return (f"TTFT SLO = {self.ttft_base_s:g} s + {self.ttft_per_1k_prompt_s:g} s per 1k prompt "
                f"tokens; deadline = {deadline}")
