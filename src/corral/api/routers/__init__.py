"""The REST API, one router per resource; `corral.server.app` includes them in this order,
which is the order of the paths in the OpenAPI document.

A handler's name and docstring are its operation's id, summary and description in the
OpenAPI document (from which `corral.sdk.types` is generated): rename with care.
"""

from fastapi import APIRouter

from corral.api.routers import (
    audit,
    cluster,
    code,
    lifecycle,
    nodes,
    queues,
    secrets,
    tokens,
    users,
    workloads,
    workspaces,
)

ROUTERS: tuple[APIRouter, ...] = (
    queues.router,
    workloads.router,
    code.router,
    lifecycle.router,
    workspaces.router,
    nodes.router,
    cluster.router,
    users.router,
    secrets.router,
    tokens.router,
    audit.router,
    cluster.health,
)
