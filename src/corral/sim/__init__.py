"""Discrete-event simulation over the engine: replay GPU-cluster traces under a policy
and measure allocation, queueing, fairness and preemption.

    trace = load_trace("synthetic")
    cluster = cluster_from_scenario(load_scenario("examples/sim-synthetic.yaml"), trace)
    result = simulate(prepare("corral", cluster), trace, cluster.quotas())
"""

from typing import TYPE_CHECKING

from corral.lazy import lazy_exports

if TYPE_CHECKING:
    from corral.sim.cluster import (
        Cluster,
        apportion,
        check_projects,
        cluster_from_scenario,
        project_queues,
        uniform_nodes,
    )
    from corral.sim.errors import SimError
    from corral.sim.loaders import NAMES as TRACE_NAMES
    from corral.sim.loaders import load_trace
    from corral.sim.metrics import ProjectResult, Series, SimResult, Stats, jain, stats
    from corral.sim.names import POLICIES
    from corral.sim.policies import Setup, prepare
    from corral.sim.simulator import SimSettings, Simulation, simulate
    from corral.sim.synthetic import synthetic_trace
    from corral.sim.trace import Job, Trace, traces_root

# Each name is imported from its module when first used: `corral simulate --help` and a
# command that needs the policies' names alone do not load the trace loaders and numpy.
__getattr__ = lazy_exports(
    __name__,
    {
        "Cluster": ("cluster", "Cluster"),
        "apportion": ("cluster", "apportion"),
        "check_projects": ("cluster", "check_projects"),
        "cluster_from_scenario": ("cluster", "cluster_from_scenario"),
        "project_queues": ("cluster", "project_queues"),
        "uniform_nodes": ("cluster", "uniform_nodes"),
        "SimError": ("errors", "SimError"),
        "TRACE_NAMES": ("loaders", "NAMES"),
        "load_trace": ("loaders", "load_trace"),
        "ProjectResult": ("metrics", "ProjectResult"),
        "Series": ("metrics", "Series"),
        "SimResult": ("metrics", "SimResult"),
        "Stats": ("metrics", "Stats"),
        "jain": ("metrics", "jain"),
        "stats": ("metrics", "stats"),
        "POLICIES": ("names", "POLICIES"),
        "Setup": ("policies", "Setup"),
        "prepare": ("policies", "prepare"),
        "SimSettings": ("simulator", "SimSettings"),
        "Simulation": ("simulator", "Simulation"),
        "simulate": ("simulator", "simulate"),
        "synthetic_trace": ("synthetic", "synthetic_trace"),
        "Job": ("trace", "Job"),
        "Trace": ("trace", "Trace"),
        "traces_root": ("trace", "traces_root"),
    },
)


__all__ = [
    "POLICIES",
    "TRACE_NAMES",
    "Cluster",
    "Job",
    "ProjectResult",
    "Series",
    "Setup",
    "SimError",
    "SimResult",
    "SimSettings",
    "Simulation",
    "Stats",
    "Trace",
    "apportion",
    "check_projects",
    "cluster_from_scenario",
    "jain",
    "load_trace",
    "prepare",
    "project_queues",
    "simulate",
    "stats",
    "synthetic_trace",
    "traces_root",
    "uniform_nodes",
]
