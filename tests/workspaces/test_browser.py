"""In Chromium: log in on the dashboard, find the notebook on the workspaces page, open it
through the proxy, and stop a workspace with its button."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from ws_support import Server

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext

CHROMIUM = Path("/usr/bin/chromium")
IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    """Headless Chromium with a fresh profile (Debian's; Playwright downloads nothing)."""
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
            args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"],
            headless=True,
        )
        context.set_default_timeout(30_000)
        yield context
        context.close()


def test_login_then_open_the_notebook(
    browser: BrowserContext, corral: Server, notebook: str
) -> None:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    # Not logged in: the notebook's URL leads to the login page, then back to it.
    page.goto(f"{corral.url}/w/team-a/{notebook}/api/status")
    assert "/login" in page.url
    page.fill("#token", corral.tokens["alice"])
    page.click("button[type=submit]")
    page.wait_for_url(f"{corral.url}/w/team-a/{notebook}/api/status")
    assert '"kernels"' in page.content()
    cookie = next(c for c in browser.cookies() if c["name"] == "corral_token")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    # The workspaces page lists it with its idle time, and opens it.
    page.goto(f"{corral.url}/workspaces")
    row = page.get_by_test_id(f"workspace-{notebook}")
    assert row.is_visible()
    assert page.get_by_test_id(f"workspace-{notebook}-idle").inner_text() != ""
    page.get_by_test_id(f"workspace-{notebook}-open-main").click()
    page.wait_for_load_state()
    assert page.url.startswith(f"{corral.url}/w/team-a/{notebook}/")
    assert "Jupyter" in page.content()
    assert not errors, errors
    page.close()


def test_the_stop_button_stops_a_workspace(browser: BrowserContext, corral: Server) -> None:
    done = corral.cli(
        "workspace",
        "create",
        "doomed",
        "-p",
        "team-b",
        "--wait",
        "0",
        "--",
        "sleep",
        "600",
    )
    assert done.returncode == 0, done.stderr
    assert corral.wait_status("doomed", "running"), corral.workload("doomed")
    page = browser.new_page()
    browser.clear_cookies()
    page.goto(f"{corral.url}/login?next=/workspaces")
    page.fill("#token", corral.tokens["bob"])
    page.click("button[type=submit]")
    page.wait_for_url(f"{corral.url}/workspaces")
    # bob sees his project's workspace only.
    assert page.get_by_test_id("workspace-doomed").is_visible()
    assert page.get_by_test_id("workspace-nb").count() == 0
    # The admin's workspace is stopped by the admin (a member stops only their own).
    browser.clear_cookies()
    page.goto(f"{corral.url}/login?next=/workspaces")
    page.fill("#token", corral.tokens["admin"])
    page.click("button[type=submit]")
    page.wait_for_url(f"{corral.url}/workspaces")
    assert page.get_by_test_id("workspace-doomed-stop").count() == 1, page.content()
    with page.expect_navigation():
        page.get_by_test_id("workspace-doomed-stop").click()
    assert page.url == f"{corral.url}/workspaces", page.content()
    corral.wait_status("doomed", "suspended")
    page.close()
