"""Python packages made by hand for tests and benchmarks that install them with uv, never
from the network: a pure-Python wheel is a zip of its modules and its metadata, and a
directory served over HTTP on loopback is both a page of links (find-links) and, for a
folder per project, a simple index."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import http.server
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path


def make_wheel(
    folder: Path, name: str, requires: tuple[str, ...] = (), version: str = "1.0"
) -> Path:
    """The wheel NAME-VERSION in `folder`: a package whose VALUE is its name, requiring
    `requires`, with a RECORD of real hashes (as installers check)."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {name!r}\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: corral-tests\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = hashlib.sha256(text.encode()).digest()
        encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{path},sha256={encoded},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    wheel.chmod(0o644)
    return wheel


@contextlib.contextmanager
def served(folder: Path) -> Iterator[str]:
    """`folder` over HTTP on 127.0.0.1, as the URL of its root (with a final "/")."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
