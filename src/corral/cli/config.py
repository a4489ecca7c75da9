"""Credentials: `corral login` saves a server and a token; every command that talks to the
server reads them back, with CORRAL_SERVER and CORRAL_TOKEN taking precedence.

They live in $XDG_CONFIG_HOME/corral/config.toml (~/.config/corral/config.toml by
default), readable by the owner only, since the token is as good as a password.
"""

import os
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tomli_w
import typer

from corral.cli.common import CliError, InvalidInput, reported_errors
from corral.sdk import ApiError, Client

ENV_SERVER = "CORRAL_SERVER"
ENV_TOKEN = "CORRAL_TOKEN"


@dataclass(frozen=True, slots=True)
class Credentials:
    server: str
    token: str
    # Where the server came from, to name it when it is not a URL.
    server_source: str


def config_path() -> Path:
    """The config file. XDG says a relative XDG_CONFIG_HOME is to be ignored."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".config"
    return root / "corral" / "config.toml"


def read_config(path: Path) -> dict[str, Any]:
    """The saved settings; empty when nothing was saved yet."""
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise CliError(f"{path}: {error}") from error
    for key in ("server", "token"):
        if key in data and not isinstance(data[key], str):
            raise CliError(f"{path}: {key}: must be a string")
    return data


def credentials() -> Credentials:
    """The server and token to use: each from its environment variable when set, else
    from the config file."""
    path = config_path()
    saved = read_config(path)
    server = os.environ.get(ENV_SERVER) or saved.get("server")
    token = os.environ.get(ENV_TOKEN) or saved.get("token")
    if not server or not token:
        raise CliError(
            "not logged in: run corral login --server URL --token TOKEN, "
            f"or set {ENV_SERVER} and {ENV_TOKEN}"
        )
    source = ENV_SERVER if os.environ.get(ENV_SERVER) else f"{path}: server"
    return Credentials(server, token, source)


def connect() -> Client:
    """A client for the logged-in user's server."""
    found = credentials()
    try:
        return Client(found.server, found.token)
    except ValueError as error:
        raise InvalidInput(f"{found.server_source}: {error}") from error


def save_credentials(server: str, token: str) -> Path:
    """Write the server and token, keeping any other settings in the file.

    The new file is written beside the old one with mode 0600 and renamed over it, so
    the token is never readable by others, not even for a moment, and a failed write
    leaves the old file whole.
    """
    path = config_path()
    settings = read_config(path)
    settings.update(server=server, token=token)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".toml")
    try:
        with os.fdopen(fd, "wb") as handle:
            tomli_w.dump(settings, handle)
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def describe_user(name: str, role: str, project: str | None) -> str:
    """ "alice (member of vision)", "root (admin)"."""
    if role == "member" and project:
        return f"{name} (member of {project})"
    return f"{name} ({role})"


def login_command(
    ctx: typer.Context,
    server: Annotated[
        str,
        typer.Option(
            "--server", help="The server's URL, e.g. http://gpu-head:8700.", show_default=False
        ),
    ],
    token: Annotated[
        str,
        typer.Option(
            "--token",
            help="Your token (asked for, unechoed, when left out).",
            prompt=True,
            hide_input=True,
            show_default=False,
        ),
    ],
) -> None:
    """Check a token with the server and save both for later commands."""
    with reported_errors(ctx):
        try:
            client = Client(server, token.strip())
        except ValueError as error:
            raise InvalidInput(f"--server: {error}") from error
        with client:
            try:
                user = client.whoami()
            except ApiError as error:
                if error.status != 401:
                    raise
                raise CliError(f"{client.server} does not accept this token") from error
        path = save_credentials(client.server, token.strip())
        who = describe_user(user["name"], user["role"], user["project"])
        typer.echo(f"Logged in to {client.server} as {who}.")
        typer.echo(f"Saved in {path}.")
        overriding = [name for name in (ENV_SERVER, ENV_TOKEN) if os.environ.get(name)]
        if overriding:
            verb = "is" if len(overriding) == 1 else "are"
            typer.echo(
                f"Note: {' and '.join(overriding)} {verb} set and will be used instead.", err=True
            )
