"""`corral server`: the control plane on this machine."""

from pathlib import Path
from typing import Annotated

import typer

from corral.cli.common import reported_errors


def server_command(
    ctx: typer.Context,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Where the store and the admin token live.",
            show_default="~/.local/share/corral",
        ),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option("--db", help="A PostgreSQL URL (postgresql://...) instead of SQLite."),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8700,
    secret_key_file: Annotated[
        Path | None,
        typer.Option(
            "--secret-key-file",
            help="The key that encrypts project secrets (also CORRAL_SECRET_KEY_FILE, or "
            "the key itself in CORRAL_SECRET_KEY). Servers sharing a PostgreSQL store "
            "must share it.",
            show_default="DATA_DIR/secret-key, created on the first start",
        ),
    ] = None,
) -> None:
    """Run the server: the REST API and the scheduler loop."""
    from corral.server import DEFAULT_DATA_DIR, serve

    with reported_errors(ctx):
        serve(data_dir or DEFAULT_DATA_DIR, db, host, port, secret_key_file)
