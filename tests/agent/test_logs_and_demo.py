"""`corral logs` against a real `corral up`, and `corral demo` run end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from livecorral import Servers

from corral.cli.logs import render

CORRAL = str(Path(sys.executable).with_name("corral"))


def test_render_keeps_only_the_last_state_of_a_progress_bar() -> None:
    text = "epoch 1\r 10%\r 50%\r100%\nnext line\n\x1b[2Kcleared\r\rdone"
    assert render(text) == "100%\nnext line\ndone"


def test_logs_prints_and_follows_a_task(corral_up: Servers, tmp_path: Path) -> None:
    up = corral_up(1, {"team": 1})
    script = (
        "import sys, time\n"
        "for i in range(1, 4):\n"
        "    sys.stdout.write(f'\\rprogress {i}/3'); sys.stdout.flush(); time.sleep(0.3)\n"
        "print(); print('finished')\n"
    )
    up.submit("bar", "team", [sys.executable, "-c", script], gpu=1)
    env = {
        **os.environ,
        "CORRAL_SERVER": up.url,
        "CORRAL_TOKEN": up.token,
        "XDG_CONFIG_HOME": str(tmp_path),
    }
    followed = subprocess.run(
        [CORRAL, "logs", "bar", "-f"], env=env, capture_output=True, text=True, timeout=60
    )
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines() == ["progress 3/3", "finished"]
    up.wait_status("bar", "succeeded")
    tail = subprocess.run(
        [CORRAL, "logs", "bar", "--tail", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert tail.stdout == "finished\n"
    missing = subprocess.run(
        [CORRAL, "logs", "nothing-here"], env=env, capture_output=True, text=True, timeout=30
    )
    assert missing.returncode == 1
    assert "not found" in missing.stderr and "Traceback" not in missing.stderr


def test_demo_tells_the_pooling_story(tmp_path: Path) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "HOME": str(tmp_path), "TMPDIR": str(temporary)}
    demo = subprocess.run([CORRAL, "demo"], env=env, capture_output=True, text=True, timeout=180)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    # Its data directory and its workloads' directory beside it are gone.
    assert list(temporary.iterdir()) == []
    out = demo.stdout
    assert "allocated GPUs: team-a 8/2 deserved" in out
    assert "preempted: reclaim for team-b/b-job" in out
    assert "team-a 6/2 deserved, team-b 2/2 deserved" in out
    assert "resuming from step" in out
    assert "the preempted job resumed from its checkpoint" in out
