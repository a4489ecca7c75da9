"""The durable store: schema, migrations, and the only code that speaks SQL."""

from corral.store.database import database_url
from corral.store.db import Store
from corral.store.errors import Conflict, Invalid, NotFound, StoreError
from corral.store.records import (
    ACTIVE,
    FINISHED,
    ROLES,
    STATUSES,
    EventRecord,
    NodeRecord,
    QueueRecord,
    TaskOnNode,
    UserRecord,
    WorkloadRecord,
)

__all__ = [
    "ACTIVE",
    "FINISHED",
    "ROLES",
    "STATUSES",
    "Conflict",
    "EventRecord",
    "Invalid",
    "NodeRecord",
    "NotFound",
    "QueueRecord",
    "Store",
    "StoreError",
    "TaskOnNode",
    "UserRecord",
    "WorkloadRecord",
    "database_url",
]
