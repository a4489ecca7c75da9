"""What a deleted workload left on a node: its logs, its run files (exit codes, telemetry),
its own directory (checkpoints among them) and its tasks' copies of their code, all named
after its directories' name (NAME.ID: corral.model.spec.directory_name). Removed once none
of its tasks runs there, so that a task in its grace period may still write its last
checkpoint and exit code."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from corral.agent.identity import workdirs_root
from corral.model.spec import is_directory_name

log = logging.getLogger("corral.agent")


def remove_leftovers(data_dir: Path, workloads_dir: Path, directory: str) -> None:
    """Remove the directories named `directory` under the agent's logs and run files and
    under its workloads directory. The workload's own directory belongs to its task's
    account, which may have put symlinks in it: shutil.rmtree follows none (on Linux it
    works by file descriptors, so a link swapped in meanwhile is not followed either), and
    the directory itself sits in one only the agent writes (corral.agent.identity)."""
    if not is_directory_name(directory):
        raise ValueError(f"{directory!r} is not the name of a workload's directories")
    for path in (
        data_dir / "logs" / directory,
        data_dir / "run" / directory,
        workloads_dir / directory,
        workdirs_root(data_dir) / directory,
    ):
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            continue
        except OSError as error:
            log.warning("could not remove %s, left by a deleted workload: %s", path, error)
