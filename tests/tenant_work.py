"""What a change of the configuration costs in tenants' limits, counted (not timed): each tenant
dumped or validated, for the tests that the work of a record does not grow with the tenants."""

import json

from schemas.config import GovernorConfig, TenantLimit


def many_tenants(count: int) -> GovernorConfig:
    """A configuration of ``count`` tenants (``t-0``...)."""
    return GovernorConfig.model_validate({"tenants": {
        f"t-{n}": {"requests_per_s": 10.0, "tokens_per_s": 1e4} for n in range(count)}})


def tenants_looked_at(monkeypatch) -> list[str]:
    """Each tenant's limits dumped or validated from here on (the names; ``?`` for one dumped
    on its own)."""
    looked_at: list[str] = []
    validate, dump, dump_one = (GovernorConfig.model_validate_json, GovernorConfig.model_dump,
                                TenantLimit.model_dump)

    def validating(cls, data, **kwargs):
        looked_at.extend(json.loads(data).get("tenants", {}))
        return validate(data, **kwargs)

    def dumping(self, **kwargs):
        data = dump(self, **kwargs)
        looked_at.extend(data.get("tenants", {}))
        return data

    monkeypatch.setattr(GovernorConfig, "model_validate_json", classmethod(validating))
    monkeypatch.setattr(GovernorConfig, "model_dump", dumping)
    monkeypatch.setattr(TenantLimit, "model_dump",
                        lambda self, **kwargs: looked_at.append("?") or dump_one(self, **kwargs))
    return looked_at
