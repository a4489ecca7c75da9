"""Fixtures for the dashboard tests: a real `corral up --virtual-gpus 4` and a real headless
Chromium driven by Playwright.

Under CI=true a missing Chromium or Playwright fails the tests; elsewhere they skip.
Playwright never downloads a browser here: it drives Debian's /usr/bin/chromium.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import pytest
from dashboard_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    CORRAL,
    IN_CI,
    Browsing,
    Corral,
    free_port,
    kill_all,
    wait_until,
)

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, ConsoleMessage


@pytest.fixture(scope="module")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corral]:
    """`corral up --virtual-gpus 4` on a free port with its own data directory."""
    data_dir = tmp_path_factory.mktemp("corral-dashboard")
    port = free_port()
    log = data_dir.parent / f"{data_dir.name}-up.log"
    with open(log, "wb") as handle:
        # A session of its own, so that teardown kills its group and nothing else.
        # As root (CI), the admin's tasks run as root, as they did before tasks ran as their
        # submitters.
        as_root = ["--admin-unix-user", "root"] if os.geteuid() == 0 else []
        process = subprocess.Popen(
            [
                *(CORRAL, "up", "--virtual-gpus", "4", "--data-dir", str(data_dir)),
                *("--port", str(port), *as_root),
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Devices sampled every second, so that the pages change within the tests.
            env={**os.environ, "CORRAL_SAMPLE_INTERVAL": "1"},
        )
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"corral up exited: {log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            return False

        wait_until(healthy, 60, "corral up to answer /healthz")
        token = (data_dir / "admin-token").read_text().strip()
        server = Corral(url, data_dir, token, process)
        yield server
        server.http.close()
    finally:
        kill_all(process, data_dir)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    """Headless Chromium with a fresh profile."""
    if not CHROMIUM.exists():
        if IN_CI:
            pytest.fail(f"{CHROMIUM} is missing; CI must install Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        if IN_CI:
            raise
        pytest.skip(f"playwright is not installed: {error}")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1440, "height": 1000},
        )
        context.set_default_timeout(15_000)
        yield context
        context.close()


@pytest.fixture
def browsing(browser: BrowserContext, corral: Corral) -> Iterator[Browsing]:
    """A fresh tab on the dashboard, logged out."""
    browser.clear_cookies()
    page = browser.new_page()
    found = Browsing(page, corral.url)

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            found.errors.append(f"console: {message.text} ({message.location.get('url')})")

    page.on("console", console)
    page.on("pageerror", lambda error: found.errors.append(f"page error: {error}"))
    yield found
    page.close()
