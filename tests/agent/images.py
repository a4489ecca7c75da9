"""OCI images made here for tests of tasks in containers (no registry is reachable): a
root filesystem of busybox-static and its applets, imported into the machine's podman."""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.agent import containers

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "id", "sleep", "echo", "cat", "head", "tail", "sort", "httpd", "touch", "mkdir")


def need_podman() -> None:
    """Skip without podman, busybox-static or root, except under CI=true (which has them)."""
    why = None
    if os.geteuid() != 0:
        why = "podman runs rootful, which needs root"
    elif shutil.which("podman", path=containers.PODMAN_PATH) is None:
        why = "podman is not installed"
    elif not BUSYBOX.exists():
        why = "busybox-static is not installed (the test image is made of it)"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI installs podman and busybox-static and runs as root: {why}")
        pytest.skip(why)


def podman(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, check=False)


@contextlib.contextmanager
def busybox_image(folder: Path, extra: dict[str, tuple[Path, int]] | None = None) -> Iterator[str]:
    """An image of busybox and its applets in /bin, with `extra` files (path in the image:
    (file here, mode), owned by root); its name, and at the end it is removed with every
    container left of the tests'."""
    archive = folder / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        for name, mode in (("bin", 0o755), ("tmp", 0o1777), ("www", 0o755)):
            entry = tarfile.TarInfo(name)
            entry.type, entry.mode = tarfile.DIRTYPE, mode
            tar.addfile(entry)
        tar.add(BUSYBOX, arcname="bin/busybox")
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        # A content of its own: images of equal content are one image to podman, and
        # removing one test's would remove another's.
        mark = secrets.token_hex(16).encode()
        entry = tarfile.TarInfo("image-id")
        entry.size = len(mark)
        tar.addfile(entry, io.BytesIO(mark))
        for name, (source, mode) in (extra or {}).items():
            entry = tar.gettarinfo(source, arcname=name)
            entry.mode, entry.uid, entry.gid = mode, 0, 0
            with open(source, "rb") as handle:
                tar.addfile(entry, handle)
    name = f"localhost/corral-test-{secrets.token_hex(3)}:latest"
    done = podman("import", "--quiet", str(archive), name)
    assert done.returncode == 0, done.stderr
    try:
        yield name
    finally:
        left = podman("ps", "-a", "--filter", "name=^corral-test-", "--format", "{{.Names}}")
        for container in left.stdout.split():
            podman("rm", "--force", "--time", "0", container)
        podman("rmi", "--force", name)
