"""Details of the dashboard seen in use, in a real headless Chromium: a shared device's
card shows each workload's fraction, the usage chart follows the department/project
choice, date labels are not clipped, and the deserved line stays inside the chart."""

from __future__ import annotations

from typing import Any

import pytest
from dashboard_support import IN_CI, Browsing, Corral, wait_until

try:
    from playwright.sync_api import Page
except ImportError:  # pragma: no cover - playwright is a dev dependency
    if IN_CI:
        raise
    pytest.skip("playwright is not installed", allow_module_level=True)

HOLD = "import time\ntime.sleep(600)\n"


@pytest.fixture(scope="module")
def shared(corral: Corral) -> Corral:
    """Two projects of a department, two workloads sharing one device, one of which holds
    exactly its project's deserved quota."""
    corral.post("/queues", {"name": "lab", "deserved": 2})
    corral.post("/queues", {"name": "lab-a", "parent": "lab", "deserved": 1})
    corral.post("/queues", {"name": "lab-b", "parent": "lab", "deserved": 1})
    corral.submit("half-a", "lab-a", HOLD, 0.5)
    corral.submit("quarter-b", "lab-b", HOLD, 0.25)
    corral.submit("whole-a", "lab-a", HOLD, 1)
    for name in ("half-a", "quarter-b", "whole-a"):
        corral.wait_status(name, "running")
    return corral


def login(browsing: Browsing, token: str) -> Page:
    page = browsing.open("/login")
    page.fill("#token", token)
    page.click("button[type=submit]")
    return page


def test_a_shared_device_shows_each_fraction(browsing: Browsing, shared: Corral) -> None:
    page = login(browsing, shared.token)
    page = browsing.open("/nodes")
    nodes = shared.get("/nodes")
    by_device: dict[str, list[tuple[str, float]]] = {}
    for node in nodes:
        for task in node["tasks"]:
            for device in task["devices"]:
                key = f"device-{node['name']}-{device}-workloads"
                by_device.setdefault(key, []).append((task["workload"], task["gpu"]))
    [shared_key] = [k for k, v in by_device.items() if {w for w, _ in v} >= {"half-a"}]
    cell = page.get_by_test_id(shared_key)
    wait_until(lambda: "half-a" in cell.inner_text(), 20, "the shared device's card")
    text = " ".join(cell.inner_text().split())
    if "quarter-b" in {w for w, _ in by_device[shared_key]}:
        assert "half-a 0.5" in text and "quarter-b 0.25" in text, text
    else:
        assert "half-a 0.5" in text, text
    [whole_key] = [k for k, v in by_device.items() if [w for w, _ in v] == ["whole-a"]]
    assert " ".join(page.get_by_test_id(whole_key).inner_text().split()) == "whole-a"
    assert browsing.errors == []


def legend(page: Page) -> list[str]:
    return [t.strip() for t in page.locator("#chart-usage .legendtext").all_text_contents()]


def test_the_usage_chart_follows_the_choice(browsing: Browsing, shared: Corral) -> None:
    page = login(browsing, shared.token)
    page = browsing.open("/usage?since=1h&by=department")
    wait_until(lambda: bool(legend(page)), 20, "the usage chart's legend")
    departments = sorted(q["name"] for q in shared.get("/queues") if q["department"])
    assert sorted(legend(page)) == departments
    assert page.get_by_test_id("usage-chart-title").inner_text() == (
        "GPU-hours by department over time"
    )
    page = browsing.open("/usage?since=1h&by=project")
    wait_until(lambda: bool(legend(page)), 20, "the usage chart's legend")
    projects = sorted(q["name"] for q in shared.get("/queues") if not q["department"])
    assert sorted(legend(page)) == projects
    assert page.get_by_test_id("usage-chart-title").inner_text() == (
        "GPU-hours by project over time"
    )
    assert browsing.errors == []


def _box(page: Page, selector: str) -> dict[str, Any]:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, selector
    return dict(box)


def test_date_labels_and_the_deserved_line_are_not_clipped(
    browsing: Browsing, shared: Corral
) -> None:
    page = login(browsing, shared.token)
    page = browsing.open("/queues")
    figure = 'figure[data-queue="lab-b"]'
    wait_until(lambda: page.locator(f"{figure} .xtick text").count() > 0, 20, "lab-b's chart axes")
    chart = _box(page, f"{figure} .main-svg")
    # Plotly hides labels that would overlap: those have no box.
    shown = [
        box
        for label in page.locator(f"{figure} .xtick text").all()
        if (box := label.bounding_box())
    ]
    assert shown
    for box in shown:
        assert box["y"] + box["height"] <= chart["y"] + chart["height"] + 0.5, (box, chart)
    # lab-b holds less than it deserves (0.25 of 1), so its deserved line is the highest
    # value of the chart: it must still lie inside the plot area, not on its clipped edge.
    plot_area = _box(page, f"{figure} .bglayer .bg")
    deserved = page.locator(f"{figure} .scatterlayer .trace").nth(2).locator("path.js-line")
    wait_until(lambda: deserved.count() > 0, 20, "the deserved line")
    line = deserved.first.bounding_box()
    assert line is not None
    assert line["y"] >= plot_area["y"] + 1, (line, plot_area)
    assert browsing.errors == []
