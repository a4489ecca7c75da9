"""What a workload may bring to its node (docs/workloads.md), checked alike by the API and
the CLI: a code snapshot (by its digest), a Python environment (the files that say what
to install, a Python version, where packages come from) and an OCI image.

The values reach a root agent, which hands them to uv and podman: a name that could be
read as an option, a path on the node, or a URL of another scheme is refused here."""

from __future__ import annotations

import re
from collections.abc import Mapping

from corral.model.spec import DIGEST_PATTERN

# The files of a Python environment, by name: one of these sets.
REQUIREMENTS = "requirements.txt"
PYPROJECT = "pyproject.toml"
LOCK = "uv.lock"
PYTHON_FILE_SETS = (frozenset({REQUIREMENTS}), frozenset({PYPROJECT}), frozenset({PYPROJECT, LOCK}))
# Their text in all: a lock of a large project is a few hundred KiB, and the whole request
# body is capped at 1 MiB (corral.api.body_limit).
PYTHON_FILES_MAX = 768 * 1024
VERSION_PATTERN = r"^3(\.[0-9]{1,2}){0,2}$"
# A workload's index options are URLs: a directory would be read on the node by uv.
URL_PATTERN = r"^https?://[^\s]+$"
URL_MAX = 2048
FIND_LINKS_MAX = 16
# An image reference: [HOST[:PORT]/]PATH[:TAG][@sha256:HEX], lower-case path components.
IMAGE_PATTERN = (
    r"^([a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?(:[0-9]{1,5})?/)?"
    r"[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)
IMAGE_MAX = 512

_DIGEST = re.compile(DIGEST_PATTERN)
_IMAGE = re.compile(IMAGE_PATTERN)


def code_problem(digest: str) -> str | None:
    """Why `digest` names no code snapshot (None when it may)."""
    if _DIGEST.match(digest) is None:
        return "must be a snapshot's digest: sha256: and 64 hex digits"
    return None


def python_files_problem(files: Mapping[str, str]) -> str | None:
    """Why `files` are no Python environment's (None when they are)."""
    names = frozenset(files)
    if names not in PYTHON_FILE_SETS:
        return (
            f"give {REQUIREMENTS}, or {PYPROJECT} (with {LOCK} when it has one); "
            f"not {', '.join(sorted(names)) or 'nothing'}"
        )
    size = sum(len(text.encode()) for text in files.values())
    if size > PYTHON_FILES_MAX:
        return f"{size} bytes in all: at most {PYTHON_FILES_MAX}"
    if any("\0" in text for text in files.values()):
        return "must not contain a NUL byte"
    return None


def image_problem(image: str) -> str | None:
    """Why `image` is no image reference (None when it is one)."""
    if len(image) > IMAGE_MAX:
        return f"at most {IMAGE_MAX} characters"
    if _IMAGE.match(image) is None:
        return "not an image reference such as registry.example/team/train:1.2"
    return None
