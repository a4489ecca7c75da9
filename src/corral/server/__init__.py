"""The control plane: FastAPI app, auth, scheduler loop.

Nothing is imported here: the scheduler's own process (`corral.server.scheduler_process`)
imports modules of this package without the application's."""
