"""The dashboard in a real headless Chromium against a real `corral up --virtual-gpus 4`,
with workloads on virtual GPUs that declare their utilisation."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from typing import Any

import pytest
from dashboard_support import IN_CI, Browsing, Corral, wait_until

try:
    from playwright.sync_api import Page, expect
except ImportError:  # pragma: no cover - playwright is a dev dependency
    if IN_CI:
        raise
    pytest.skip("playwright is not installed", allow_module_level=True)

LIVE = 20_000  # ms: a few of the pages' refreshes

# Tasks on virtual GPUs declare their utilisation; a declaration counts for 30 s, so they
# repeat it every second.
BUSY = """
import time
from corral.sdk import report_utilization
for step in range(1, 1000):
    report_utilization(80, memory="12GiB")
    print(f"training step {step}", flush=True)
    time.sleep(1)
"""
LIGHT = """
import time
from corral.sdk import report_utilization
while True:
    report_utilization(30)
    time.sleep(1)
"""
# Busy for a while, then idle while still holding its GPU.
GOES_IDLE = """
import time
from corral.sdk import report_utilization
for _ in range(10):
    report_utilization(80)
    time.sleep(1)
print("done with the GPU, still holding it", flush=True)
while True:
    report_utilization(0)
    time.sleep(1)
"""


def amount(value: float | None) -> str:
    """How the pages show a GPU amount."""
    return "—" if value is None else f"{round(value, 2):g}"


@pytest.fixture(scope="module")
def cluster(corral: Corral) -> Corral:
    """A department with two projects, two running workloads that declare utilisation, a
    finished one and one that waits (its project's limit)."""
    corral.post("/queues", {"name": "research", "deserved": 4})
    corral.post("/queues", {"name": "vision", "parent": "research", "deserved": 2, "limit": 3})
    corral.post("/queues", {"name": "nlp", "parent": "research", "deserved": 2})
    corral.submit("train-busy", "vision", BUSY, 1)
    corral.submit("notebook", "nlp", LIGHT, 0.5)
    corral.submit("hello", "nlp", "print('hello from corral')", 0)
    # Within the node and vision's limit, so accepted, but not beside train-busy.
    corral.submit("big-wait", "vision", "pass", 3)
    corral.wait_status("train-busy", "running")
    corral.wait_status("notebook", "running")
    corral.wait_status("hello", "succeeded")
    corral.wait_status("big-wait", "pending")
    return corral


def devices_in(corral: Corral, state: str) -> int:
    return sum(d["state"] == state for d in corral.get("/telemetry/devices"))


def login(browsing: Browsing, token: str) -> Page:
    page = browsing.open("/login")
    page.fill("#token", token)
    page.click("button[type=submit]")
    return page


def refreshed(page: Page, times: int = 1) -> None:
    """Wait until the page's script has refreshed it from the API `times` times."""
    body = page.locator("body")
    wait_until(
        lambda: int(body.get_attribute("data-refreshes") or 0) >= times,
        LIVE / 1000,
        f"{times} refreshes of {page.url}",
    )


def shows(page: Page, testid: str, expected: Callable[[], str], timeout: float = 20) -> None:
    """The element shows what the API says, asked afresh until the two agree (both move)."""
    locator = page.get_by_test_id(testid)
    last: list[str] = []

    def agree() -> bool:
        want = expected()
        got = (locator.text_content() or "").strip()
        last[:] = [want, got]
        return want == got

    try:
        wait_until(agree, timeout, f"{testid} to show the API's value")
    except AssertionError:
        raise AssertionError(f"{testid}: the API says {last[0]!r}, the page {last[1]!r}") from None


def test_login_rejects_a_bad_token(browsing: Browsing, corral: Corral) -> None:
    page = browsing.open("/workloads")
    expect(page).to_have_url(re.compile(r"/login\?next=%2Fworkloads$"))
    page.fill("#token", "crl_not-a-token")
    page.click("button[type=submit]")
    expect(page.get_by_test_id("login-error")).to_be_visible()
    expect(page).to_have_url(re.compile(r"/login\?"))
    assert not [c for c in page.context.cookies() if c["name"] == "corral_token"]
    # Nothing behind the login is reachable without one, the scripts' API bridge included.
    assert page.request.get(f"{corral.url}/ui/api/cluster").status == 401
    browsing.screenshot("login-rejected")

    page.fill("#token", corral.token)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{corral.url}/workloads")
    expect(page.get_by_test_id("whoami")).to_contain_text("admin")
    cookie = next(c for c in page.context.cookies() if c["name"] == "corral_token")
    assert cookie["httpOnly"]
    assert browsing.errors == []


PAGES = [
    ("overview", "/?since=15m", "Cluster overview"),
    ("queues", "/queues?since=15m", "Queues"),
    ("workloads", "/workloads", "Workloads"),
    ("workload", "/workloads/train-busy?since=15m", "train-busy"),
    ("nodes", "/nodes", "Nodes"),
    ("usage", "/usage?since=1h", "Usage"),
]


def test_every_page_loads_and_refreshes_without_console_errors(
    browsing: Browsing, cluster: Corral
) -> None:
    login(browsing, cluster.token)
    for name, path, heading in PAGES:
        page = browsing.open(path)
        expect(page.locator("h1")).to_contain_text(heading)
        refreshed(page)
        page.wait_for_load_state("networkidle")
        browsing.screenshot(name)
    assert browsing.errors == []


def test_overview_numbers_are_the_apis(browsing: Browsing, cluster: Corral) -> None:
    page = login(browsing, cluster.token)
    # The server renders the data; the script only keeps it fresh.
    html = page.request.get(f"{cluster.url}/").text()
    assert 'data-testid="gpus-allocated">1.5<' in html
    assert 'data-testid="gpus-total">4<' in html
    assert 'data-testid="workload-state-train-busy">busy<' in html
    shows(page, "gpus-allocated", lambda: amount(cluster.get("/cluster")["gpus_allocated"]))
    assert page.get_by_test_id("gpus-allocated").inner_text() == "1.5"

    def workloads_in(status: str) -> int:
        return int(cluster.get("/cluster")["workloads"][status])

    for status in ("running", "pending"):
        shows(page, f"workloads-{status}", lambda s=status: str(workloads_in(s)))

    for state in ("free", "busy", "idle"):
        shows(page, f"gpus-{state}", lambda s=state: str(devices_in(cluster, s)))
    assert page.get_by_test_id("gpus-free").inner_text() == "2"
    shows(page, "workload-state-train-busy", lambda: "busy")
    waits = page.locator("#waits-rows tr")
    assert waits.first.get_attribute("data-workload") == "big-wait"
    refreshed(page)
    assert browsing.errors == []


def test_queue_view_says_why_a_weight_moved(browsing: Browsing, cluster: Corral) -> None:
    """With time-decayed fair share on for the department, each queue's row and the list
    under the table give its effective weight and the usage it comes from, as the API."""
    response = cluster.http.patch("/queues/research", json={"fair_share_half_life": "1h"})
    assert response.status_code == 200, response.text
    try:
        page = login(browsing, cluster.token)
        page = browsing.open("/queues")

        def reason(queue: str) -> Callable[[], str]:
            def value() -> str:
                found = cluster.get(f"/queues/{queue}")["weight_reason"]
                return f"{queue}: {found}" if found else ""

            return value

        for queue in ("research", "vision", "nlp"):
            shows(page, f"queue-{queue}-weight-reason", reason(queue))
        text = page.get_by_test_id("queue-vision-weight-reason").inner_text()
        assert "of the cluster's GPU-time over a 1h half-life" in text
        title = page.get_by_test_id("queue-vision-weight").get_attribute("title") or ""
        assert title.startswith("weight 1") and title.endswith("over a 1h half-life")
        assert browsing.errors == []
    finally:
        response = cluster.http.patch("/queues/research", json={"fair_share_half_life": None})
        assert response.status_code == 200, response.text


def test_queue_numbers_are_the_apis(browsing: Browsing, cluster: Corral) -> None:
    page = login(browsing, cluster.token)
    page = browsing.open("/queues")

    def field(queue: str, key: str) -> Callable[[], str]:
        def value() -> str:
            found = cluster.get(f"/queues/{queue}")
            if key == "pending_gpu":
                return amount(found[key])
            return amount((found[key] or {}).get("gpu"))

        return value

    for queue in ("research", "vision", "nlp"):
        for key, testid in (
            ("deserved", "deserved"),
            ("allocated", "allocated"),
            ("fair_share", "fair-share"),
            ("pending_gpu", "pending"),
        ):
            shows(page, f"queue-{queue}-{testid}", field(queue, key))
    assert page.get_by_test_id("queue-vision-limit").inner_text() == "3"
    assert page.get_by_test_id("queue-nlp-limit").inner_text() == "∞"
    assert page.get_by_test_id("queue-vision-allocated").inner_text() == "1"
    # Time-decayed fair share is off (again, after the test above): the weight as set, and
    # no reasons, once a cycle has run since.
    weight = page.get_by_test_id("queue-vision-weight")
    wait_until(lambda: weight.inner_text() == "1", 20, "vision's weight as set")
    reasons = page.locator("#weight-reasons li")
    wait_until(lambda: reasons.count() == 0, 20, "no weight reasons")
    # The tree: the department first, its projects under it.
    order = page.locator("#queue-rows tr").evaluate_all("rows => rows.map(r => r.dataset.queue)")
    assert order == ["research", "nlp", "vision"]
    assert browsing.errors == []


def test_nodes_show_each_device_as_the_api_sees_it(browsing: Browsing, cluster: Corral) -> None:
    page = login(browsing, cluster.token)
    page = browsing.open("/nodes")
    devices = cluster.get("/telemetry/devices")
    assert len(devices) == 4
    for device in devices:
        key = f"device-{device['node']}-{device['device']}"

        def state(d: dict[str, Any] = device) -> str:
            now = cluster.get("/telemetry/devices")
            return next(x["state"] for x in now if x["device"] == d["device"])

        shows(page, f"{key}-state", state)
        cell = page.get_by_test_id(key)
        assert "virtual" in cell.locator(".cell-head").inner_text()
    busy = next(d for d in cluster.get("/telemetry/devices") if "train-busy" in str(d["workloads"]))
    key = f"device-{busy['node']}-{busy['device']}"
    shows(page, f"{key}-util", lambda: "80%")
    assert "declared" in page.get_by_test_id(key).locator(".cell-head").inner_text()
    assert page.get_by_test_id(f"{key}-workloads").inner_text() == "train-busy"
    refreshed(page)
    assert browsing.errors == []


def test_workloads_filter_and_the_detail_page(browsing: Browsing, cluster: Corral) -> None:
    page = login(browsing, cluster.token)
    page = browsing.open("/workloads")
    shows(page, "workloads-count", lambda: str(len(cluster.get("/workloads"))))
    page.get_by_test_id("filter-status").select_option("pending")
    expect(page).to_have_url(f"{cluster.url}/workloads?status=pending")
    shows(page, "workloads-count", lambda: str(len(cluster.get("/workloads", status="pending"))))
    expect(page.locator("#workload-rows tr")).to_have_count(1)
    row = page.get_by_test_id("row-big-wait")
    reason = cluster.get("/workloads/big-wait")["reason"]
    assert reason and reason in row.inner_text()
    page.get_by_test_id("filter-status").select_option("")
    page.get_by_test_id("filter-project").select_option("nlp")
    shows(page, "workloads-count", lambda: str(len(cluster.get("/workloads", project="nlp"))))
    expect(page.get_by_test_id("status-hello")).to_have_text("succeeded")

    page = browsing.open("/workloads/train-busy")
    expect(page.get_by_test_id("workload-status")).to_have_text("running")
    assert page.get_by_test_id("spec-project").inner_text() == "vision"
    # The log tail follows the task's output as it grows.
    first = page.get_by_test_id("log-tail").inner_text()
    assert "training step" in first
    expect(page.get_by_test_id("log-tail")).not_to_have_text(first, timeout=LIVE)
    tail = cluster.get("/workloads/train-busy/logs", tail=50)["text"]
    assert len(tail.splitlines()) <= 50
    shows(page, "events-count", lambda: str(len(cluster.get("/workloads/train-busy/events"))))
    expect(page.locator("#util-source")).to_be_visible()
    expect(page.locator("#chart-util .main-svg").first).to_be_attached()
    assert browsing.errors == []


def test_usage_table_and_csv_download(browsing: Browsing, cluster: Corral) -> None:
    page = login(browsing, cluster.token)
    page = browsing.open("/usage?since=1h&by=project")
    rows = cluster.get("/usage", since="1h", by="project", format="json")
    rows = rows if isinstance(rows, list) else rows["rows"]
    assert {r["key"] for r in rows} >= {"vision", "nlp"}
    for row in rows:
        for key in ("allocated", "used", "idle"):
            shown = page.get_by_test_id(f"usage-{row['key']}-{key}")
            expect(shown).to_be_visible()
            # GPU-hours grow while work runs: equal to the API's within what a few
            # seconds add.
            assert float(shown.inner_text()) == pytest.approx(row[f"gpu_hours_{key}"], abs=0.01), (
                row["key"],
                key,
            )
    with page.expect_download() as download_info:
        page.get_by_test_id("usage-csv").click()
    download = download_info.value
    assert download.suggested_filename == "corral-usage-1h-by-project.csv"
    with open(download.path(), encoding="utf-8") as handle:
        downloaded = list(csv.DictReader(handle))
    response = cluster.http.get("/usage", params={"since": "1h", "by": "project", "format": "csv"})
    expected = list(csv.DictReader(io.StringIO(response.text)))
    assert [r["key"] for r in downloaded] == [r["key"] for r in expected]
    assert downloaded and set(downloaded[0]) == set(expected[0])
    expect(page.locator("#chart-usage .main-svg").first).to_be_attached()
    refreshed(page)
    assert browsing.errors == []


def test_an_idle_workload_goes_from_busy_to_idle_on_the_overview(
    browsing: Browsing, cluster: Corral
) -> None:
    page = login(browsing, cluster.token)
    cluster.submit("train-idle", "nlp", GOES_IDLE, 1)
    state = page.get_by_test_id("workload-state-train-idle")
    expect(state).to_have_text("busy", timeout=30_000)
    busy_before = int(page.get_by_test_id("gpus-busy").inner_text())
    expect(state).to_have_text("idle", timeout=60_000)
    shows(page, "gpus-idle", lambda: str(devices_in(cluster, "idle")))
    assert int(page.get_by_test_id("gpus-busy").inner_text()) == busy_before - 1
    browsing.screenshot("overview-idle")
    assert browsing.errors == []
