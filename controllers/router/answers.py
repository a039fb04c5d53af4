"""How long answers run: how many tokens the router expects a request to generate.

A client's ``max_tokens`` is a cap, not a forecast: the shared traces' answers average a sixth
to a quarter of their service's cap (Mooncake: 348 tokens of 2,000; Azure: 260 of 1,000), so a
router that took the cap for the answer would reckon decode work several times too large. Yet
an engine that ignores the end of sequence (the project's live workers do, so that a stream's
length is known) runs every answer to its cap. The router learns, from the completions it
reads, the share of its ``max_tokens`` each answer ran to, and expects a request to generate
its ``max_tokens`` times the recent mean of that share among its tenant's requests on its model
with a cap of the same order (a power-of-two band, ``_band``: a tenant's one-token
classifications do not stand for its 4,096-token chats), the model's in that band before the
tenant has ``OWN_AFTER`` answers of its own there: the mean answer for a client whose cap is
fixed, the cap itself where answers run to it. Before any answer on its model in that band it
expects ``PRIOR_TOKENS``, or its cap if that is less.
"""

from schemas.requests import InferenceRequest

#: Completions a mean follows: each new answer weighs 1/SPAN of it once it has SPAN answers
#: (before that, all weigh the same).
SPAN = 64
#: A tenant's own answers on a model before its mean is taken over the model's.
OWN_AFTER = 8
#: Tokens expected of an answer before any on its model is known: a short chat answer (the
#: shared traces' medians run 25-358 tokens).
PRIOR_TOKENS = 256
#: Tenants' means kept (clients name tenants): past this, the one heard of least recently is
#: forgotten.
MAX_TENANTS = 10_000


def _band(max_tokens: int) -> int:
    """The power-of-two band of a cap: (2^(k-1), 2^k] is band k (caps of 1,024 and 1,000 share
    one, 1,025 is in the next)."""
    return (max_tokens - 1).bit_length()


class _Mean:
    __slots__ = ("value", "count")

    def __init__(self) -> None:
        self.value = 0.0
        self.count = 0

    def add(self, x: float) -> None:
        self.count += 1
        self.value += (x - self.value) / min(self.count, SPAN)


class AnswerLengths:
    def __init__(self) -> None:
        self._models: dict[tuple[str, int], _Mean] = {}  # (model, cap band)
        #: (tenant, model, cap band), least recently heard of first
        self._tenants: dict[tuple[str, str, int], _Mean] = {}

    def completed(self, tenant: str, model: str, output_tokens: int, max_tokens: int) -> None:
        """A request of ``tenant`` on ``model`` that asked for at most ``max_tokens`` completed
        with ``output_tokens`` (each completion once)."""
        share = min(output_tokens / max(max_tokens, 1), 1.0)
        band = _band(max_tokens)
        mean = self._models.get((model, band))
        if mean is None:
            mean = self._models[(model, band)] = _Mean()
        mean.add(share)
        key = (tenant, model, band)
        mean = self._tenants.pop(key, None)
        if mean is None:
            if len(self._tenants) >= MAX_TENANTS:
                del self._tenants[next(iter(self._tenants))]
            mean = _Mean()
        self._tenants[key] = mean  # (at the end: the most recently heard of)
        mean.add(share)

    def expected(self, request: InferenceRequest) -> float:
        """Tokens ``request`` is expected to generate in all, at least one."""
        band = _band(request.max_tokens)
        own = self._tenants.get((request.tenant, request.model, band))
        if own is None or own.count < OWN_AFTER:
            own = self._models.get((request.model, band))
        if own is None:
            return float(max(min(request.max_tokens, PRIOR_TOKENS), 1))
        return max(request.max_tokens * own.value, 1.0)

    def left(self, request: InferenceRequest, tokens_done: int,
             expected: float | None = None) -> int:
        """Tokens ``request`` is expected to generate still, ``tokens_done`` generated: at
        least one while its cap allows (an answer past the mean is not known to be ending).
        ``expected``: ``expected(request)``, where the caller has it already."""
        if expected is None:
            expected = self.expected(request)
        return min(request.max_tokens - tokens_done, max(round(expected) - tokens_done, 1))
