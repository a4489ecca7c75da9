"""The running system: the scheduler loop (in this process or one of its own), dispatch
of decisions to the agents and of their reports to the store, submissions and audit
records written in batches, the monitor's upkeep. Built once (`ControlPlane`) and handed
to the API; it never imports the API.

Nothing is imported here: the scheduler's own process (`corral.control.scheduler_process`)
imports modules of this package without the others'."""
