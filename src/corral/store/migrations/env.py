"""Alembic environment: corral runs migrations itself, on the connection it hands over."""

from alembic import context
from sqlalchemy import engine_from_config, pool

from corral.store import telemetry_schema  # noqa: F401  (its tables join the metadata)
from corral.store.schema import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section) or {},
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as fresh:
        context.configure(connection=fresh, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
