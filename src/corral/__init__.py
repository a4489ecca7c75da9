"""corral: a GPU cluster scheduler and workload manager."""

__version__ = "0.1.0"
