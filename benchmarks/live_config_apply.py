"""What one ``governor config set`` record costs the components that apply it, against how many
tenants the configuration holds.

    python -m benchmarks.live_config_apply [--tenants 10,100,300,1000] [--repeat 20]

Each component recomputes the configuration a record gives (``LiveConfig.apply``: the new
configuration validated, of the tenants only the one the record sets, and when each leaf under
its key was set) and takes it: a router (``RouterCore.apply_config``: its admission limits,
policy, overrides) on its event loop, and the controllers (``ControllersService.apply_config``).
No broker: the same objects, fed records as the config topic carries them, each tenant set by a
record of its own (``config set tenants.NAME``), then one more record changing one tenant's
rate, ``--repeat`` times. Prints, in CPU milliseconds (the machine may be shared), the median
and the most of one record in each, of ``LiveConfig.to_restore`` (a router writing a setting
again after a rejected record) and of ``kept_otherwise`` (``governor config set``, for the
change it writes); and the CPU seconds of reading the N tenants' records at start (a component
started on the topic applies each).
"""

import argparse
import statistics
import time

from controllers.live_config import LiveConfig
from controllers.router.core import RouterCore
from controllers.service import ControllersService
from schemas.config import ConfigSet, GovernorConfig
from schemas.topics import TopicCatalog
from workers.sim.models import model_specs

T0 = 1_800_000_000_000


def _limit(n: int) -> dict:
    return {"requests_per_s": 10.0 + n % 7, "tokens_per_s": 10_000.0, "priority": n % 10}


class _Component:
    """A component's configuration and what it does with each record it applies."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "router":
            self.core = RouterCore(GovernorConfig())
            self.live = LiveConfig("router", check=RouterCore(GovernorConfig()).apply_config)
        else:
            self.service = ControllersService("127.0.0.1:1", TopicCatalog("governor"))
            self.live = LiveConfig("controllers",
                                   check=lambda candidate: model_specs(candidate.models))
        self.offset = 0

    def apply(self, key: str, value, at_ms: int) -> str:
        record = ConfigSet(event_time_ms=at_ms, key=key, value=value)
        before = self.live.config
        verdict = self.live.apply(record, self.offset, at_ms, key.encode(), written_ms=at_ms)
        self.offset += 1
        if verdict.type == "config_applied":
            if self.kind == "router":
                self.core.apply_config(self.live.config, record)
            else:
                self.service.overrides.configured(before, self.live.config, record)
                self.service.apply_config(self.live.config)
        return verdict.type


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:8.1f} {max(samples) * 1000:8.1f}"


def measure(kind: str, tenants: int, repeat: int) -> dict[str, list[float]]:
    component = _Component(kind)
    started = time.process_time()
    for n in range(tenants):
        assert component.apply(f"tenants.t-{n}", _limit(n), T0 + n) == "config_applied"
    times: dict[str, list[float]] = {"apply": [], "to_restore": [], "kept_otherwise": [],
                                     "start": [time.process_time() - started]}
    for r in range(repeat):
        at = T0 + tenants + 2 * r
        started = time.process_time()
        verdict = component.apply(f"tenants.t-{r % tenants}.requests_per_s", 20.0 + r, at)
        times["apply"].append(time.process_time() - started)
        assert verdict == "config_applied"
        # a record rejected under a key set before: a router writes the value in force again
        key = f"tenants.t-{r % tenants}"
        assert component.apply(key, {**_limit(r), "priority": 10}, at + 1) == "config_rejected"
        started = time.process_time()
        restore = component.live.to_restore(at + 1)
        times["to_restore"].append(time.process_time() - started)
        assert [record.key for record in restore] == [key]
        if r < 3:  # (the writer's: slow, and the same each time)
            started = time.process_time()
            component.live.kept_otherwise(at + 1)
            times["kept_otherwise"].append(time.process_time() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", default="10,100,300,1000")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print("component   tenants | one record ms (median, max) | to_restore ms (median, max) | "
          "kept_otherwise ms (median, max) | start s")
    for tenants in (int(t) for t in args.tenants.split(",")):
        for kind in ("router", "controllers"):
            times = measure(kind, tenants, args.repeat)
            print(f"{kind:11} {tenants:7,} | {_ms(times['apply'])} | {_ms(times['to_restore'])} "
                  f"| {_ms(times['kept_otherwise'])} | {times['start'][0]:7.2f}")


if __name__ == "__main__":
    main()
