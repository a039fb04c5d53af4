"""The offline virtual-time simulator (``governor sim``): the live router and controllers driving
a fleet of calibrated simulated engines, with cost accounting. See ``driver.py``."""

from infra.sim.driver import Simulation
from infra.sim.options import SimOptions
from infra.sim.slo import SloRule
from infra.sim.summary import summarize

__all__ = ["SimOptions", "Simulation", "SloRule", "simulate", "summarize"]


def simulate(trace, options: SimOptions = SimOptions(), trace_name: str = "trace",
             progress=None) -> tuple[dict, Simulation]:
    """Run one simulation; return its ``--json`` object and the finished ``Simulation``."""
    sim = Simulation(trace, options).run(progress)
    return summarize(sim, trace_name), sim
