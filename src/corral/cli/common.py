"""What every command shares: the global options, exit codes and error reporting."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import typer

from corral.scenario import ScenarioError

# A check the user asked for did not hold (for `plan`: an expectation).
EXIT_CHECK_FAILED = 1
# The input was invalid: a bad file, field or argument (click uses 2 for usage errors too).
EXIT_INVALID = 2
# corral itself failed; the one-line message asks for --debug to see the traceback.
EXIT_INTERNAL = 3


@dataclass(frozen=True, slots=True)
class CliState:
    """Options given before the command name (`corral --debug plan ...`)."""

    debug: bool = False


def cli_state(ctx: typer.Context) -> CliState:
    state = ctx.find_object(CliState)
    return state if state is not None else CliState()


@contextmanager
def reported_errors(ctx: typer.Context) -> Iterator[None]:
    """Turn a failure inside the block into one line on stderr and an exit code.

    An invalid scenario exits EXIT_INVALID with its message; anything unexpected exits
    EXIT_INTERNAL. Users never see a traceback unless they ask with --debug, which lets
    the exception through.
    """
    try:
        yield
    except (typer.Exit, typer.Abort, typer.TyperException):
        raise
    except ScenarioError as error:
        if cli_state(ctx).debug:
            raise
        typer.echo(str(error), err=True)
        raise typer.Exit(EXIT_INVALID) from None
    except Exception as error:
        if cli_state(ctx).debug:
            raise
        typer.echo(
            f"internal error: {type(error).__name__}: {error} "
            "(run with corral --debug to see the traceback)",
            err=True,
        )
        raise typer.Exit(EXIT_INTERNAL) from None
