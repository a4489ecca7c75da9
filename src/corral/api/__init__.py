"""The REST API under /api/v1: its middleware (audit, limits, NUL and methods), auth and
the handlers' dependencies, the errors, one router per resource and the schemas."""
