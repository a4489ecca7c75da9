"""What travels from the submitter's shell to the task, as with Slurm's `sbatch --export`.

`corral submit` takes the submitting shell's variables (`--export ALL`, the default), only
the named ones (`--export PATH,VIRTUAL_ENV,...`) or none (`--export NONE`), and puts them
in the workload's `env`. The agent then builds the task's environment from the workload
alone (docs/trust.md): nothing of the server's or the agent's own environment is added,
HOME, USER and LOGNAME stay those of the account the task runs as, and corral's variables
(devices, ranks) win over anything exported.

The workload's `env` is stored and shown to whoever may read the workload, so ALL leaves
out what names a secret (TOKEN, SECRET, PASSWORD, KEY, ... in the name) or holds one (a URL
with a password, a private key, a token of a well-known shape): give those with
`--secret`, or name one explicitly; `corral submit` says which it left out, by name. It
also leaves out the CLI's own credentials (CORRAL_*) and what belongs to the login session
rather than to the job (HOME, SHELL, DISPLAY, SSH_*, ...).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from corral.cli.common import InvalidInput

# The API's rule for a variable's name (corral.api.schemas.ENV_PATTERN).
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The API takes at most this many variables (WorkloadIn.env).
_MOST = 1024
# A value longer than this is the kind a shell builds up by itself (LS_COLORS); it is
# left out of ALL rather than stored with every workload.
_LONGEST = 16384

# The session's, or the account's (the agent sets them for the account the task runs as).
SESSION = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "MAIL",
        "TERM",
        "TERMCAP",
        "COLORTERM",
        "DISPLAY",
        "WAYLAND_DISPLAY",
        "XAUTHORITY",
        "DBUS_SESSION_BUS_ADDRESS",
        "XDG_RUNTIME_DIR",
        "XDG_SESSION_ID",
        "XDG_SESSION_TYPE",
        "XDG_SESSION_CLASS",
        "XDG_SEAT",
        "XDG_VTNR",
        "TMUX",
        "TMUX_PANE",
        "STY",
        "WINDOW",
        "LS_COLORS",
        "PS1",
        "PS2",
        "PROMPT_COMMAND",
        "HISTFILE",
        "LINES",
        "COLUMNS",
    }
)
# Prefixes of the session's variables.
SESSION_PREFIXES = ("SSH_", "BASH_FUNC_", "GPG_", "XDG_SESSION", "KITTY_", "VSCODE_")
# corral sets these for each task (the CLI's own CORRAL_SERVER and CORRAL_TOKEN among
# the CORRAL_ ones, which must never be stored with a workload).
CORRAL_OWN = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "NODE_RANK",
    }
)
# A name holding one of these words is taken for a secret's.
_SECRET_WORDS = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|(^|_)KEY($|_)|AUTH)",
    re.IGNORECASE,
)


# Values that carry a credential whatever their variable is called.
_SECRET_VALUES = re.compile(
    "|".join(
        (
            # A URL with a password: postgres://user:password@host/db, redis://:pw@host.
            r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:]*:[^/?#@\s]+@",
            # A password in a connection string or a URL's query: password=..., ?token=...
            r"(?i:(?:^|[\s;&?])(?:password|passwd|pwd|access_token|api_key|apikey)=[^\s;&])",
            # A PEM or PGP private key.
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----",
            # Tokens of well-known shapes: corral's own, GitHub, GitLab, Slack, Hugging
            # Face, OpenAI and Anthropic, Google API, AWS access key ids, JSON Web Tokens.
            r"(?<![A-Za-z0-9_-])(?:crl_[A-Za-z0-9_-]{40,}|gh[pousr]_[A-Za-z0-9]{36,}"
            r"|github_pat_[A-Za-z0-9_]{40,}|glpat-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}"
            r"|hf_[A-Za-z0-9]{30,}|sk-(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{32,}"
            r"|AIza[A-Za-z0-9_-]{35})",
            r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])",
            r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        )
    )
)


def looks_secret(name: str) -> bool:
    """Whether a variable's name says it holds a secret (AWS_SECRET_ACCESS_KEY, HF_TOKEN)."""
    return bool(_SECRET_WORDS.search(name))


def holds_secret(value: str) -> bool:
    """Whether a value carries a credential, whatever its variable's name: a URL with a
    password, a private key, a token of a well-known shape."""
    return bool(_SECRET_VALUES.search(value))


def _left_out_of_all(name: str, value: str) -> bool:
    return _not_for_a_workload(name, value) or _secret(name, value)


def _not_for_a_workload(name: str, value: str) -> bool:
    """Left out of ALL whatever it holds: not a valid name or value, too long, the login
    session's, or corral's own."""
    return (
        not _NAME.match(name)
        or "\0" in value
        or len(value) > _LONGEST
        or name in SESSION
        or name.startswith(SESSION_PREFIXES)
        or name in CORRAL_OWN
        or name.startswith("CORRAL_")
    )


def _secret(name: str, value: str) -> bool:
    return looks_secret(name) or holds_secret(value)


def secrets_left_out(export: str, environ: Mapping[str, str]) -> list[str]:
    """The names (never the values) of the variables `--export ALL` left out because
    their name or value looks like a credential, sorted; none for any other --export."""
    if export.strip().upper() != "ALL":
        return []
    return sorted(
        name
        for name, value in environ.items()
        if not _not_for_a_workload(name, value) and _secret(name, value)
    )


def exported(export: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables `--export EXPORT` takes from `environ`: ALL (the default, less what is
    left out above), NONE, or a comma-separated list of names (each must be set, and may
    be one ALL leaves out, except CORRAL_*: the CLI's credentials never travel)."""
    choice = export.strip()
    if choice.upper() == "NONE":
        return {}
    if choice.upper() == "ALL":
        taken = {k: v for k, v in sorted(environ.items()) if not _left_out_of_all(k, v)}
        if len(taken) > _MOST:
            raise InvalidInput(
                f"--export: this shell has {len(taken)} variables to export, more than the "
                f"{_MOST} a workload takes; name the ones the task needs"
            )
        return taken
    names = [part.strip() for part in choice.split(",")]
    taken = {}
    for name in names:
        if not _NAME.match(name):
            raise InvalidInput(
                f"--export: {name!r} is not a variable name (give ALL, NONE or NAME,NAME,...)"
            )
        if name.startswith("CORRAL_") or name in CORRAL_OWN:
            raise InvalidInput(f"--export: {name} is corral's own and is never exported")
        if name not in environ:
            raise InvalidInput(f"--export: {name} is not set in this shell")
        if "\0" in environ[name]:
            raise InvalidInput(f"--export: {name} holds a NUL byte")
        taken[name] = environ[name]
    return taken
