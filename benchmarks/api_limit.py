"""The stack's own limit: a bare FastAPI endpoint that does the least a submission must.

    python benchmarks/api_limit.py --port PORT --data-dir DIR [--db URL]

It serves POST /api/v1/workloads on uvicorn as `corral server` does (one process, the
same uvicorn settings): a bearer token compared with the one in DIR/admin-token, the body
validated by a Pydantic model of the same shape as a single-GPU submission (project,
name, tasks, command), and one row committed per request with SQLAlchemy (SQLite in DIR
with the store's pragmas, WAL and synchronous=FULL; or the PostgreSQL database at URL),
answered 201 with the row. No scheduler, no audit, no idempotency, no group commit.

`api_throughput.py --against-bare` starts it beside `corral server` in the same run and
measures both with the same clients, so that corral's figures read as a share of what
FastAPI, Pydantic, SQLAlchemy and the database allow on this machine at this moment.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import (
    JSON,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    insert,
)
from sqlalchemy.exc import IntegrityError

metadata = MetaData()
workloads = Table(
    "workloads",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(63), unique=True),
    Column("project", String(63)),
    Column("body", JSON),
    Column("created_at", Float),
)


class TaskIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu: float = Field(1, ge=0, le=64)


class SubmissionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    project: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    tasks: list[TaskIn] = Field(min_length=1, max_length=16)
    command: list[str] = Field(min_length=1, max_length=1024)


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def create_app(data_dir: Path, db: str | None) -> FastAPI:
    url = db or f"sqlite:///{data_dir / 'bare.db'}"
    engine = create_engine(url)
    if url.startswith("sqlite"):
        event.listen(engine, "connect", _sqlite_pragmas)
    metadata.create_all(engine)
    token = secrets.token_urlsafe(24)
    (data_dir / "admin-token").write_text(token + "\n")
    app = FastAPI()

    def authorised(request: Request) -> None:
        if request.headers.get("authorization") != f"Bearer {token}":
            raise HTTPException(401, "a valid bearer token is needed")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/workloads", status_code=201, dependencies=[Depends(authorised)])
    def submit(body: SubmissionIn) -> Response:
        row = {
            "name": body.name,
            "project": body.project,
            "body": body.model_dump(),
            "created_at": time.time(),
        }
        try:
            with engine.begin() as connection:
                row["id"] = connection.execute(
                    insert(workloads).values(**row)
                ).inserted_primary_key[0]
        except IntegrityError:
            raise HTTPException(409, f"workload {body.name!r} already exists") from None
        return Response(json.dumps(row), 201, media_type="application/json")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--db", help="a PostgreSQL URL; SQLite in the data directory without")
    args = parser.parse_args()
    app = create_app(args.data_dir, args.db)
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning",
                            access_log=False)  # fmt: skip
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
