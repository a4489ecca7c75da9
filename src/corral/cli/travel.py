"""What a workload brings to its node, as `corral submit` and `corral apply -f` give it:
`--code DIR` (`code:`), packed here into a snapshot and uploaded once per tree (the server
keeps it by digest: a second submit of the same tree sends nothing); `--requirements FILE`
with `--python`, `--index-url` and `--find-links` (`python:`), read here and sent as text;
`--image` (`image:`). See docs/workloads.md."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from corral.cli.common import InvalidInput
from corral.model import format_memory
from corral.model.spec import DIGEST_PATTERN
from corral.sdk import Client
from corral.sdk.snapshot import DEFAULT_CAP, SnapshotTooLarge, pack

PYPROJECT = "pyproject.toml"
LOCK = "uv.lock"
REQUIREMENTS = "requirements.txt"
_DIGEST = re.compile(DIGEST_PATTERN)


def requirements_files(option: str, given: str) -> dict[str, str]:
    """The files of a Python environment, by the name the API takes, from the file the
    user named: a pyproject.toml (with the uv.lock beside it, when there is one), a uv.lock
    (with the pyproject.toml beside it), or a requirements file of any name."""
    path = Path(given)
    names = {PYPROJECT: path.with_name(PYPROJECT), LOCK: path.with_name(LOCK)}
    if path.name == PYPROJECT:
        wanted = {PYPROJECT: path} | ({LOCK: names[LOCK]} if names[LOCK].is_file() else {})
    elif path.name == LOCK:
        if not names[PYPROJECT].is_file():
            raise InvalidInput(f"{option}: {given}: a uv.lock needs the pyproject.toml beside it")
        wanted = {PYPROJECT: names[PYPROJECT], LOCK: path}
    else:
        wanted = {REQUIREMENTS: path}
    files = {}
    for name, source in wanted.items():
        try:
            files[name] = source.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidInput(f"{option}: cannot read {source}: {error}") from None
    return files


def travel_fields(
    code: str | None,
    requirements: str | None,
    python: str | None,
    index_url: str | None,
    find_links: list[str] | None,
    image: str | None,
) -> dict[str, Any]:
    """The fields of `corral submit`'s options (`code` still a directory: see `bring_code`)."""
    fields: dict[str, Any] = {}
    if code is not None:
        fields["code"] = code
    environment: dict[str, Any] = {}
    if requirements is not None:
        environment["requirements"] = requirements_files("--requirements", requirements)
    for option, value in (
        ("--python", python),
        ("--index-url", index_url),
        ("--find-links", find_links),
    ):
        if value and requirements is None:
            raise InvalidInput(f"{option}: give --requirements FILE too (what to install)")
    if python is not None:
        environment["version"] = python
    if index_url is not None:
        environment["index_url"] = index_url
    if find_links:
        environment["find_links"] = find_links
    if environment:
        fields["python"] = environment
    if image is not None:
        fields["image"] = image
    return fields


def read_python_field(where: str, document: dict[str, Any]) -> dict[str, Any]:
    """A workload file's `python:` with `requirements:` given as a file's path (relative
    to the working directory) read into the files the API takes."""
    environment = document.get("python")
    if isinstance(environment, dict) and isinstance(environment.get("requirements"), str):
        files = requirements_files(f"{where}: python.requirements", environment["requirements"])
        return {**document, "python": {**environment, "requirements": files}}
    return document


def bring_code(client: Client | None, body: dict[str, Any], where: str = "--code") -> None:
    """Pack the directory `body["code"]` names (a digest is left as it is) and make its
    snapshot the project's, uploading it only when the server lacks it; `body["code"]`
    becomes its digest. Without a client (a dry run) nothing is packed."""
    given = body.get("code")
    if client is None or not isinstance(given, str) or _DIGEST.match(given):
        return
    directory = Path(given)
    if not directory.is_dir():
        raise InvalidInput(f"{where}: {given} is not a directory")
    try:
        snapshot = pack(directory, DEFAULT_CAP)
    except SnapshotTooLarge as error:
        raise InvalidInput(f"{where}: {error}") from None
    except ValueError as error:
        raise InvalidInput(f"{where}: {error}") from None
    for skipped in snapshot.skipped:
        typer.echo(
            f"Note: {where}: {skipped} is left out (a link out of the tree, or not a file)",
            err=True,
        )
    sent = client.upload_code(str(body["project"]), snapshot.digest, snapshot.data)
    what = f"{snapshot.files} files, {format_memory(snapshot.size)}"
    done = f"sent {format_memory(sent)}" if sent else "the server has it already"
    typer.echo(f"Code: {given}: {what}; {done}", err=True)
    body["code"] = snapshot.digest
