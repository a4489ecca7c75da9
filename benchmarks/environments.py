"""What bringing work to a node costs (issue 45), on a real `corral up` with one virtual GPU,
against a task that brings nothing, in the same run:

- a code snapshot of a tree of TREE_MIB MiB (random, so that gzip gains nothing): packed
  (`snapshot_mib`, `pack_s`), uploaded (`upload_s`), and a second submit of the same tree,
  which must send nothing (`second_submit_upload_bytes`);
- a Python environment of PACKAGES hand-made wheels served on loopback (no network): the
  time from a task's binding to its start while its node builds it (`env_cold_build_s`),
  and for a second workload asking for the same one (`env_warm_start_s`, goal under 1 s),
  beside a task that brings nothing (`process_task_start_s`);
- a task that starts in its own copy of that snapshot (`code_task_start_s`);
- a task in a busybox image imported into podman (`image_task_start_s`), when podman runs
  here (root, podman, busybox-static), else null with the reason.

Each start is read from the workload's events, from its binding to its end (every task
here does nothing), so it is the node's time, not the client's, and a container counts
until it ran. Best of REPEAT for the starts that are not the first build.

    sudo python benchmarks/environments.py [--tree-mib 20] [--packages 12] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent / "tests" / "agent")]

from images import busybox_image  # noqa: E402
from livecorral import CorralUp, open_folder  # noqa: E402
from wheels import make_wheel, served  # noqa: E402

from corral.agent.containers import probe  # noqa: E402
from corral.sdk import Client  # noqa: E402
from corral.sdk.snapshot import pack  # noqa: E402


def tree_of(folder: Path, mib: int) -> Path:
    """A project of `mib` MiB of incompressible files, 1 MiB each, and a script."""
    tree = folder / "project"
    (tree / "data").mkdir(parents=True)
    for index in range(mib):
        (tree / "data" / f"part-{index:03d}.bin").write_bytes(os.urandom(1 << 20))
    (tree / "train.py").write_text("print('ran')\n")
    return tree


def index_of(folder: Path, packages: int) -> tuple[Path, str]:
    """A simple index of `packages` wheels, each requiring the one before, and the
    requirements that pull them all in (the last one)."""
    root = folder / "index"
    for number in range(packages):
        name = f"pkg{number:02d}"
        (root / name).mkdir(parents=True)
        requires = (f"pkg{number - 1:02d}",) if number else ()
        make_wheel(root / name, name, requires)
    return root, f"pkg{packages - 1:02d}\n"


def start_seconds(up: CorralUp, name: str, timeout: float = 600) -> float:
    """Seconds from the workload's binding to the end of its task, which does nothing:
    what it took its node to make it ready and run it (for a task in an image, until its
    container ran; a task's start report comes when its launcher starts)."""
    done = up.wait_status(name, timeout=timeout)
    if done["status"] != "succeeded":
        raise RuntimeError(f"{name} {done['status']}: {done['reason']}")
    events = {event["kind"]: event["time"] for event in up.events(name)}
    return float(events["succeeded"] - events["bound"])


def measure(tree_mib: int, packages: int, repeat: int) -> dict[str, Any]:
    with open_folder("corral-bench-env-", 0o755) as folder:
        tree = tree_of(folder, tree_mib)
        root, requirements = index_of(folder, packages)
        up = CorralUp(folder / "corral", 1).start()
        try:
            up.queue("team", 1)
            with served(root) as url, Client(up.url, up.token) as client:
                began = time.perf_counter()
                snapshot = pack(tree)
                packed = time.perf_counter() - began
                began = time.perf_counter()
                sent = client.upload_code("team", snapshot.digest, snapshot.data)
                upload = time.perf_counter() - began
                again = client.upload_code("team", snapshot.digest, pack(tree).data)
                python = {"requirements": {"requirements.txt": requirements}, "index_url": url}
                runs: dict[str, list[float]] = {"process": [], "warm": [], "code": [], "image": []}
                up.submit("cold", "team", ["python", "-c", "import pkg00"], python=python)
                cold = start_seconds(up, "cold")
                for attempt in range(repeat):
                    up.submit(f"plain-{attempt}", "team", ["true"])
                    runs["process"].append(start_seconds(up, f"plain-{attempt}"))
                    command = ["python", "-c", "import pkg00"]
                    up.submit(f"warm-{attempt}", "team", command, python=python)
                    runs["warm"].append(start_seconds(up, f"warm-{attempt}"))
                    up.submit(f"code-{attempt}", "team", ["ls", "train.py"], code=snapshot.digest)
                    runs["code"].append(start_seconds(up, f"code-{attempt}"))
                image_note = None
                found = probe()
                if found.available and Path("/bin/busybox").exists():
                    with busybox_image(folder) as image:
                        for attempt in range(repeat):
                            command = ["sh", "-c", "true"]  # a builtin of the image's sh
                            up.submit(f"boxed-{attempt}", "team", command, image=image)
                            runs["image"].append(start_seconds(up, f"boxed-{attempt}"))
                else:
                    image_note = found.reason or "busybox-static is not installed"
        finally:
            up.close()
    return {
        "tree_files_mib": tree_mib,
        "packages": packages,
        "snapshot_mib": round(len(snapshot.data) / (1 << 20), 2),
        "pack_s": round(packed, 3),
        "upload_s": round(upload, 3),
        "upload_bytes": sent,
        "second_submit_upload_bytes": again,
        "env_cold_build_s": round(cold, 3),
        "env_warm_start_s": round(min(runs["warm"]), 3),
        "code_task_start_s": round(min(runs["code"]), 3),
        "process_task_start_s": round(min(runs["process"]), 3),
        "image_task_start_s": round(min(runs["image"]), 3) if runs["image"] else None,
        "image_note": image_note,
        "runs": {kind: [round(v, 3) for v in values] for kind, values in runs.items()},
        "load": os.getloadavg()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree-mib", type=int, default=20)
    parser.add_argument("--packages", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="the figures as one JSON line last")
    args = parser.parse_args()
    figures = measure(args.tree_mib, args.packages, args.repeat)
    if not args.json:
        for key, value in figures.items():
            print(f"{key:28} {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
