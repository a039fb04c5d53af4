"""How long answers run: how many tokens the router expects a request to generate.

A client's ``max_tokens`` is a cap, not a forecast: the shared traces' answers average a sixth
to a quarter of their service's cap (Mooncake: 348 tokens of 2,000; Azure: 260 of 1,000), so a
router that took the cap for the answer would reckon decode work several times too large. The
router learns the answers from the completions it reads (``Completed.output_tokens``) and
expects a request to generate the recent mean of its tenant's answers on its model (the
model's, before the tenant has ``OWN_AFTER`` of its own; ``PRIOR_TOKENS`` before the model has
any), never more than its ``max_tokens``.
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
#: Tenants' means kept (clients name tenants): past this, the oldest tenant is forgotten.
MAX_TENANTS = 10_000


class _Mean:
    __slots__ = ("value", "count")

    def __init__(self) -> None:
        self.value = 0.0
        self.count = 0

    def add(self, tokens: int) -> None:
        self.count += 1
        self.value += (tokens - self.value) / min(self.count, SPAN)


class AnswerLengths:
    def __init__(self) -> None:
        self._models: dict[str, _Mean] = {}
        self._tenants: dict[tuple[str, str], _Mean] = {}

    def completed(self, tenant: str, model: str, output_tokens: int) -> None:
        """A request of ``tenant`` on ``model`` completed with ``output_tokens``."""
        mean = self._models.get(model)
        if mean is None:
            mean = self._models[model] = _Mean()
        mean.add(output_tokens)
        key = (tenant, model)
        mean = self._tenants.get(key)
        if mean is None:
            if len(self._tenants) >= MAX_TENANTS:
                del self._tenants[next(iter(self._tenants))]
            mean = self._tenants[key] = _Mean()
        mean.add(output_tokens)

    def expected(self, request: InferenceRequest) -> float:
        """Tokens ``request`` is expected to generate in all."""
        own = self._tenants.get((request.tenant, request.model))
        if own is not None and own.count >= OWN_AFTER:
            tokens = own.value
        else:
            model = self._models.get(request.model)
            tokens = model.value if model is not None else PRIOR_TOKENS
        return min(float(request.max_tokens), max(tokens, 1.0))

    def left(self, request: InferenceRequest, tokens_done: int) -> int:
        """Tokens ``request`` is expected to generate still, ``tokens_done`` generated: at
        least one while its cap allows (an answer past the mean is not known to be ending)."""
        return min(request.max_tokens - tokens_done,
                   max(round(self.expected(request)) - tokens_done, 1))
