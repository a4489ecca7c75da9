"""What every command shares: the global options, exit codes and error reporting."""

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, TypeVar

import typer
import yaml
from rich.console import Console
from rich.text import Text

from corral.model import parse_memory
from corral.model.durations import parse_duration
from corral.scenario import ScenarioError
from corral.sdk import ApiError, ServerUnreachable

_Value = TypeVar("_Value")

# A check the user asked for did not hold (for `plan`: an expectation).
EXIT_CHECK_FAILED = 1
# The server refused the request or could not be reached, or there are no credentials.
EXIT_FAILED = 1
# The input was invalid: a bad file, field or argument (click uses 2 for usage errors too).
EXIT_INVALID = 2
# corral itself failed; the one-line message asks for --debug to see the traceback.
EXIT_INTERNAL = 3


# HTTP statuses that mean the request itself was wrong, like a bad argument.
_INVALID_STATUSES = (400, 413, 422)


class CliError(Exception):
    """A failure the user can act on, shown as its message alone; exits `code`."""

    code = EXIT_FAILED


class InvalidInput(CliError):
    """A bad argument or option value, found before anything was sent."""

    code = EXIT_INVALID


@dataclass(frozen=True, slots=True)
class CliState:
    """Options given before the command name (`corral --debug plan ...`)."""

    debug: bool = False


def cli_state(ctx: typer.Context) -> CliState:
    state = ctx.find_object(CliState)
    return state if state is not None else CliState()


@contextmanager
def reported_errors(ctx: typer.Context) -> Iterator[None]:
    """Turn a failure inside the block into one red line on stderr and an exit code.

    An invalid scenario, argument or request exits EXIT_INVALID with its message; a
    refused request or an unreachable server exits EXIT_FAILED; anything unexpected
    exits EXIT_INTERNAL. Users never see a traceback unless they ask with --debug, which
    lets the exception through.
    """
    try:
        yield
    except (typer.Exit, typer.Abort, typer.TyperException):
        raise
    except Exception as error:
        if cli_state(ctx).debug:
            raise
        message, code = _explain(error)
        report_error(message)
        raise typer.Exit(code) from None


def check_server_environment() -> None:
    """What the server reads from the environment, checked before it starts:
    InvalidInput naming the variable."""
    from corral.api.threads import worker_threads

    try:
        worker_threads()
    except ValueError as error:
        raise InvalidInput(str(error)) from None


def report_error(message: str) -> None:
    """One line on stderr, in red where colour is shown; never wrapped."""
    Console(stderr=True, soft_wrap=True, highlight=False).print(Text(message, style="red"))


def _explain(error: Exception) -> tuple[str, int]:
    if isinstance(error, ScenarioError):
        return str(error), EXIT_INVALID
    if isinstance(error, CliError):
        return str(error), error.code
    if isinstance(error, ApiError):
        if error.status == 401:
            return f"{error.message} (log in again with corral login)", EXIT_FAILED
        return error.message, EXIT_INVALID if error.status in _INVALID_STATUSES else EXIT_FAILED
    if isinstance(error, ServerUnreachable):
        return str(error), EXIT_FAILED
    return (
        f"internal error: {type(error).__name__}: {error} "
        "(run with corral --debug to see the traceback)",
        EXIT_INTERNAL,
    )


def format_when(stamp: float | None) -> str:
    """A time as local "YYYY-MM-DD HH:MM:SS", or "-"."""
    if stamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def print_json(data: object) -> None:
    """The API's JSON on stdout, as --json promises: nothing else goes there."""
    typer.echo(json.dumps(data, indent=2))


def parse_number(flag: str, text: str, what: str) -> float:
    """A finite number of 0 or more given to `flag`; InvalidInput names the flag."""
    try:
        value = float(text)
    except ValueError:
        raise InvalidInput(f"{flag}: {text!r} is not {what}") from None
    if not 0 <= value < math.inf:
        raise InvalidInput(f"{flag}: {text!r} must be 0 or more")
    return value


def parse_memory_option(flag: str, text: str) -> int:
    """Bytes from "512MiB", "80GiB"; InvalidInput names the flag."""
    return _parsed(flag, parse_memory, text)


def parse_duration_option(flag: str, text: str) -> float:
    """Seconds from "90", "30m", "2d"; InvalidInput names the flag."""
    return _parsed(flag, parse_duration, text)


def _parsed(flag: str, parse: Callable[[str], _Value], text: str) -> _Value:
    try:
        return parse(text)
    except ValueError as error:
        raise InvalidInput(f"{flag}: {error}") from None


def secret_refs(flag: str, items: list[str]) -> dict[str, str]:
    """`--secret NAME` (the variable NAME gets the secret NAME) or `--secret VAR=NAME`, as
    the API's `secrets` (variable -> secret name)."""
    refs = {}
    for item in items:
        variable, equals, name = item.partition("=")
        if equals and not (variable and name):
            raise InvalidInput(f"{flag}: {item!r} is not NAME or VARIABLE=NAME")
        refs[variable] = name if equals else variable
    return refs


def parse_pairs(flag: str, items: list[str]) -> list[tuple[str, str]]:
    """KEY=VALUE options, in the order given; the value may itself contain "="."""
    pairs = []
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise InvalidInput(f"{flag}: {item!r} is not KEY=VALUE")
        pairs.append((key, value))
    return pairs


# `-o` of the list commands: the table (default), a wider one, or the API's data.
OUTPUT_FORMATS = ("table", "wide", "json", "yaml")
# The project of the workload a command names: a workload's name is unique within its
# project, so it is needed only where a name is used in several projects one may read.
InProject = Annotated[
    str | None,
    typer.Option(
        "--project",
        "-p",
        help="The workload's project, where its name is used in several of yours "
        "(or write PROJECT/NAME).",
        show_default=False,
    ),
]


def addressed(ctx: typer.Context, name: str, project: str | None) -> str:
    """The workload NAME of `project` as PROJECT/NAME (the SDK's form), or as given; a
    project that the name contradicts is the command's error."""
    if project is None:
        return name
    given, separator, short = name.rpartition("/")
    with reported_errors(ctx):
        if separator and given != project:
            raise InvalidInput(f"--project: {project!r}, but the name says {given!r}")
    return f"{project}/{short if separator else name}"


OutputFormat = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        metavar="wide|json|yaml",
        help="wide: a table with more columns; json or yaml: the API's data.",
    ),
]


def printed_as_data(data: object, output: str, json_output: bool = False) -> bool:
    """Print `data` as JSON or YAML when `-o json|yaml` (or --json) asks for it, and say
    whether it did; the caller prints its table otherwise. InvalidInput for another -o."""
    if output not in OUTPUT_FORMATS:
        raise InvalidInput(f"-o/--output: {output!r} is not one of {', '.join(OUTPUT_FORMATS)}")
    if json_output or output == "json":
        print_json(data)
        return True
    if output == "yaml":
        typer.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), nl=False)
        return True
    return False


def out_console() -> Console:
    """The console that prints a command's output. Sent to a pipe or a file, it is not cut
    to 80 columns (Rich's width without a terminal or COLUMNS): tables are as wide as their
    cells, and lines are not wrapped."""
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        return Console(width=PIPED_WIDTH)
    return Console()


# Wide enough for any row; a table is only as wide as its cells.
PIPED_WIDTH = 4096
