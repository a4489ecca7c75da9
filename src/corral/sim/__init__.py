"""Discrete-event simulation over the engine: replay GPU-cluster traces under a policy
and measure allocation, queueing, fairness and preemption.

    trace = load_trace("synthetic")
    cluster = cluster_from_scenario(load_scenario("examples/sim-synthetic.yaml"), trace)
    result = simulate(prepare("corral", cluster), trace, cluster.quotas())
"""

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
from corral.sim.policies import POLICIES, Setup, prepare
from corral.sim.simulator import SimSettings, Simulation, simulate
from corral.sim.synthetic import synthetic_trace
from corral.sim.trace import Job, Trace, traces_root

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
