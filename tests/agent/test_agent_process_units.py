"""corral.agent.process on real processes: identity by pid and start time, the launcher,
exit codes, signals to the whole group, adoption."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from livecorral import proc_state, wait_until

from corral.agent.process import TaskProcess, alive, process_start


@pytest.fixture
def spawned() -> Iterator[list[TaskProcess]]:
    """TaskProcesses a test started; their groups are killed and reaped afterwards."""
    processes: list[TaskProcess] = []
    yield processes
    for process in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        if process.popen is not None:
            process.popen.wait(timeout=10)


def spawn(
    tmp_path: Path,
    spawned: list[TaskProcess],
    command: list[str],
    env: dict[str, str] | None = None,
    workdir: str | None = None,
) -> TaskProcess:
    process = TaskProcess.spawn(
        command,
        {**os.environ, **(env or {})},
        workdir,
        tmp_path / "logs" / "task-0.log",
        tmp_path / "run" / "task-0.exit",
    )
    spawned.append(process)
    return process


def wait_exit(process: TaskProcess, timeout: float = 20) -> int:
    # A tuple, so that exit code 0 counts as an answer.
    [code] = wait_until(
        lambda: None if (c := process.exit_code()) is None else (c,),
        timeout,
        f"{process.pid} to end",
        0.05,
    )
    return int(code)


def wait_log(tmp_path: Path, text: str) -> None:
    log = tmp_path / "logs" / "task-0.log"
    wait_until(lambda: log.exists() and text in log.read_text(), 20, repr(text), 0.05)


# -- process_start and alive --------------------------------------------------------------


def test_process_start_and_alive_follow_a_real_child() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        started = process_start(child.pid)
        assert isinstance(started, int) and started > 0
        assert process_start(child.pid) == started  # stable
        assert alive(child.pid, started)
        # The same pid with another start time is another process (a reused pid).
        assert not alive(child.pid, started + 1)
        assert process_start(os.getpid()) is not None
        assert process_start(os.getpid()) <= started  # type: ignore[operator]
        child.kill()
        # Dead but not yet reaped: a zombie is not alive.
        wait_until(lambda: proc_state(child.pid) == "Z", 10, "the child to be a zombie")
        assert process_start(child.pid) == started
        assert not alive(child.pid, started)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert process_start(child.pid) is None
    assert not alive(child.pid, started)


def test_process_start_reads_past_a_command_name_with_spaces_and_parentheses(
    tmp_path: Path,
) -> None:
    odd = tmp_path / "a) b (c"
    odd.symlink_to("/bin/sleep")
    before = subprocess.Popen(["sleep", "30"])
    strange = subprocess.Popen([str(odd), "30"])
    after = subprocess.Popen(["sleep", "30"])
    try:
        assert Path(f"/proc/{strange.pid}/stat").read_text().split(" (", 1)[1].startswith("a) b")
        first, middle, last = (process_start(p.pid) for p in (before, strange, after))
        assert first is not None and middle is not None and last is not None
        assert first <= middle <= last
        assert alive(strange.pid, middle)
    finally:
        for child in (before, strange, after):
            child.kill()
            child.wait(timeout=10)


# -- TaskProcess ---------------------------------------------------------------------------


def test_spawn_runs_the_command_in_its_own_group_and_records_its_exit_code(
    tmp_path: Path, spawned: list[TaskProcess]
) -> None:
    go = tmp_path / "go"
    script = 'echo "hello $GREETING from $(pwd)"; echo oops >&2; '
    script += "until [ -e go ]; do sleep 0.05; done; exit 7"
    process = spawn(tmp_path, spawned, ["sh", "-c", script], {"GREETING": "corral"}, str(tmp_path))
    wait_log(tmp_path, "oops")
    assert process.exit_code() is None
    assert process.proc_start == process_start(process.pid)
    assert alive(process.pid, process.proc_start)
    assert os.getpgid(process.pid) == process.pid != os.getpgrp()
    go.touch()
    assert wait_exit(process) == 7
    assert (tmp_path / "run" / "task-0.exit").read_text().strip() == "7"
    assert (tmp_path / "logs" / "task-0.log").read_text() == f"hello corral from {tmp_path}\noops\n"
    assert process.exit_code() == 7  # asking again gives the same answer


def test_a_new_run_appends_to_the_log_and_forgets_the_old_exit_code(
    tmp_path: Path, spawned: list[TaskProcess]
) -> None:
    assert wait_exit(spawn(tmp_path, spawned, ["sh", "-c", "echo first; exit 3"])) == 3
    second = spawn(tmp_path, spawned, ["sh", "-c", "sleep 0.5; echo second"])
    assert second.exit_code() is None  # the previous run's exit file is not this run's end
    assert wait_exit(second) == 0
    assert (tmp_path / "logs" / "task-0.log").read_text() == "first\nsecond\n"


def test_the_task_is_a_process_group_apart_from_ours(
    tmp_path: Path, spawned: list[TaskProcess]
) -> None:
    process = spawn(tmp_path, spawned, ["sh", "-c", "echo group $(ps -o pgid= $$); sleep 30"])
    wait_log(tmp_path, "group")
    assert os.getpgid(process.pid) == process.pid != os.getpgrp()
    text = (tmp_path / "logs" / "task-0.log").read_text()
    assert text.split()[1] == str(process.pid)  # the command is in the launcher's group
    assert process.exit_code() is None


def test_a_command_that_exits_0(tmp_path: Path, spawned: list[TaskProcess]) -> None:
    assert wait_exit(spawn(tmp_path, spawned, ["true"])) == 0


def test_a_missing_executable_reports_127_and_says_why(
    tmp_path: Path, spawned: list[TaskProcess]
) -> None:
    process = spawn(tmp_path, spawned, ["corral-test-no-such-program"])
    assert wait_exit(process) == 127
    log = (tmp_path / "logs" / "task-0.log").read_text()
    assert "cannot start 'corral-test-no-such-program'" in log


def test_a_missing_workdir_ends_the_task_126_and_says_why(
    tmp_path: Path, spawned: list[TaskProcess]
) -> None:
    # The launcher enters the working directory in the command's process, after it has
    # become the task's account, so a missing one is the task's end, with its reason.
    process = spawn(tmp_path, spawned, ["true"], workdir=str(tmp_path / "nowhere"))
    assert wait_exit(process) == 126
    assert process.ended() == (
        126,
        f"cannot enter the working directory {str(tmp_path / 'nowhere')!r} as the agent user",
    )
    log = (tmp_path / "logs" / "task-0.log").read_text()
    assert "No such file or directory" in log


def test_the_task_gets_exactly_the_environment_it_is_given(
    tmp_path: Path, spawned: list[TaskProcess]
) -> None:
    os.environ["CORRAL_TEST_LAUNCHER_CANARY"] = "leaked"
    try:
        process = spawn_exact(tmp_path, spawned, ["/usr/bin/env"], {"ONLY": "this"})
    finally:
        del os.environ["CORRAL_TEST_LAUNCHER_CANARY"]
    assert wait_exit(process) == 0
    lines = (tmp_path / "logs" / "task-0.log").read_text().splitlines()
    assert lines == ["ONLY=this"]


def spawn_exact(
    tmp_path: Path, spawned: list[TaskProcess], command: list[str], env: dict[str, str]
) -> TaskProcess:
    process = TaskProcess.spawn(
        command, env, None, tmp_path / "logs" / "task-0.log", tmp_path / "run" / "task-0.exit"
    )
    spawned.append(process)
    return process


def test_the_command_killed_by_sigkill_reports_137(
    tmp_path: Path, spawned: list[TaskProcess]
) -> None:
    process = spawn(tmp_path, spawned, ["sh", "-c", "echo pid $$; sleep 30"])
    wait_log(tmp_path, "pid ")
    command = int((tmp_path / "logs" / "task-0.log").read_text().split()[1])
    assert command != process.pid
    os.kill(command, signal.SIGKILL)
    assert wait_exit(process) == 137
    assert (tmp_path / "run" / "task-0.exit").read_text().strip() == "137"


def test_the_whole_group_killed_by_sigkill_reports_137(
    tmp_path: Path, spawned: list[TaskProcess]
) -> None:
    process = spawn(tmp_path, spawned, ["sh", "-c", "echo pid $$; sleep 30"])
    wait_log(tmp_path, "pid ")
    process.signal(signal.SIGKILL)
    # The launcher died too and recorded nothing; that still reads as SIGKILL.
    assert wait_exit(process) == 137
    assert not (tmp_path / "run" / "task-0.exit").exists()
    process.signal(signal.SIGKILL)  # a group that is gone already is fine


def test_sigterm_handled_by_a_trap_exits_with_its_own_code(
    tmp_path: Path, spawned: list[TaskProcess]
) -> None:
    script = 'trap "echo caught TERM; exit 42" TERM; echo ready; while :; do sleep 0.1; done'
    process = spawn(tmp_path, spawned, ["sh", "-c", script])
    wait_log(tmp_path, "ready")
    process.signal(signal.SIGTERM)
    assert wait_exit(process) == 42
    assert "caught TERM" in (tmp_path / "logs" / "task-0.log").read_text()


def test_sigterm_without_a_handler_reports_143(tmp_path: Path, spawned: list[TaskProcess]) -> None:
    process = spawn(
        tmp_path,
        spawned,
        [sys.executable, "-c", "print('up', flush=True)\nimport time; time.sleep(30)"],
    )
    wait_log(tmp_path, "up")
    process.signal(signal.SIGTERM)
    # The launcher ignores SIGTERM and outlives its command to record how it ended.
    assert wait_exit(process) == 143


def launcher(tmp_path: Path, command: list[str], *python: str) -> subprocess.Popen[bytes]:
    """A launcher (or `python` arguments that run one) of `command`, waiting for its
    environment on its standard input."""
    python = python or (sys.executable, "-I", "-m", "corral.agent.launch")
    return subprocess.Popen(
        [*python, "--exit-file", str(tmp_path / "task.exit"), "--", *command],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )


def handles(pid: int, number: int) -> bool:
    """Whether process `pid` catches or ignores signal `number` (it would not die of it)."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    mask = int(fields["SigIgn"], 16) | int(fields["SigCgt"], 16)
    return bool(mask >> (number - 1) & 1)


def finish(process: subprocess.Popen[bytes], env: dict[str, str]) -> int:
    """Give a launcher its environment and wait for it; its whole group is killed after."""
    try:
        assert process.stdin is not None
        with process.stdin:
            process.stdin.write(json.dumps(env).encode())
        return process.wait(timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_stop_sent_before_the_command_starts_means_it_never_starts(tmp_path: Path) -> None:
    """The agent stops a task just after starting it: the SIGTERM reaches the launcher
    while it still reads the task's environment, and no command to pass it to exists yet."""
    started = tmp_path / "started"
    process = launcher(tmp_path, ["sh", "-c", f"touch {started}; sleep 30"])
    wait_until(lambda: handles(process.pid, signal.SIGTERM), 20, "the launcher's handler")
    os.killpg(process.pid, signal.SIGTERM)
    assert finish(process, dict(os.environ)) == 143
    assert (tmp_path / "task.exit").read_text() == "143\nstopped before its command started\n"
    assert not started.exists()


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("", "no environment on standard input (its agent ended before sending it)"),
        ('["PATH=/bin"]', "the environment on standard input is not a JSON object of strings"),
        ('{"PATH": 1}', "the environment on standard input is not a JSON object of strings"),
        ('{"PATH": "/bin"', "Expecting"),
    ],
)
def test_a_launcher_without_its_environment_does_not_start_the_command(
    tmp_path: Path, given: str, why: str
) -> None:
    """An agent killed between starting a launcher and writing its environment: the command
    does not run with the launcher's own environment (no devices named in it)."""
    started = tmp_path / "started"
    process = launcher(tmp_path, ["sh", "-c", f"touch {started}"])
    assert process.stdin is not None
    with process.stdin:
        process.stdin.write(given.encode())
    assert process.wait(timeout=20) == 126
    code, reason = (tmp_path / "task.exit").read_text().split("\n", 1)
    assert code == "126"
    assert reason.startswith(f"cannot prepare the task: {why}")
    assert not started.exists()


# Runs the launcher with its group sent SIGTERM just as the command is started, after the
# launcher last looked for a stop and before the command exists.
STOPPED_WHILE_STARTING = """
import os, signal, subprocess, sys
from corral.agent import launch
start = subprocess.Popen
def stopped_meanwhile(*args, **kwargs):
    os.killpg(0, signal.SIGTERM)
    return start(*args, **kwargs)
subprocess.Popen = stopped_meanwhile
sys.exit(launch.main(sys.argv[1:]))
"""


def test_a_stop_sent_while_the_command_is_started_reaches_the_command(tmp_path: Path) -> None:
    process = launcher(tmp_path, ["sleep", "30"], sys.executable, "-c", STOPPED_WHILE_STARTING)
    assert finish(process, dict(os.environ)) == 143
    assert (tmp_path / "task.exit").read_text() == "143\n"


def test_an_adopted_task_is_watched_through_its_exit_file(
    tmp_path: Path, spawned: list[TaskProcess]
) -> None:
    """After a restart the task is not the agent's child: its end is read from the file."""
    go = tmp_path / "go"
    script = "echo waiting; until [ -e go ]; do sleep 0.05; done; exit 5"
    process = spawn(tmp_path, spawned, ["sh", "-c", script], workdir=str(tmp_path))
    wait_log(tmp_path, "waiting")
    adopted = TaskProcess.adopt(process.pid, process.proc_start, process.exit_file)
    assert adopted.popen is None and adopted.exit_code() is None
    # A wrong start time means the pid now belongs to someone else: the task is gone, and
    # with no exit file nobody recorded how, which reads as SIGKILL.
    stranger = TaskProcess.adopt(process.pid, process.proc_start + 1, tmp_path / "none.exit")
    assert stranger.exit_code() == 137
    go.touch()
    # The launcher stays a zombie until its parent (this test) reaps it; it is not alive.
    assert wait_exit(adopted) == 5
    assert wait_exit(process) == 5
