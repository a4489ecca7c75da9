"""What the API's listings cost the database: a listing reads all its rows at once, so
that a longer list costs no more queries (no query per queue)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event

from corral.model import Queue
from corral.server.app import create_app
from corral.store import Store


def test_listing_queues_costs_as_many_queries_for_many_queues_as_for_one(store: Store) -> None:
    token = store.ensure_admin()
    store.create_queue(Queue("dept"))
    statements: list[str] = []

    def executed(*args: Any) -> None:
        statements.append(args[2])

    event.listen(store.engine, "before_cursor_execute", executed)
    app = create_app(store, run_scheduler=False)
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:

        def listing() -> tuple[int, int]:
            client.get("/api/v1/queues")  # the token is remembered from now on
            statements.clear()
            answer = client.get("/api/v1/queues")
            assert answer.status_code == 200, answer.text
            return len(answer.json()), len(statements)

        one, queries = listing()
        for index in range(10):
            store.create_queue(Queue(f"project-{index}", parent="dept"))
        many, queries_for_many = listing()
    assert (one, many) == (1, 11)
    assert queries_for_many == queries
