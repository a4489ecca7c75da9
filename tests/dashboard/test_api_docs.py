"""/docs: the API's interactive documentation, served by corral itself (no CDN) under a
content security policy, rendered in a real Chromium, and a call tried from it with a
token answers as the API does."""

from __future__ import annotations

import httpx
from dashboard_support import Browsing, Corral


def test_docs_render_offline_under_the_policy(browsing: Browsing, corral: Corral) -> None:
    redirect = httpx.get(f"{corral.url}/docs", follow_redirects=False)
    assert redirect.status_code == 307
    assert redirect.headers["location"] == "/api/v1/docs"
    page_response = httpx.get(f"{corral.url}/api/v1/docs")
    assert "script-src 'self'" in page_response.headers["content-security-policy"]
    assert "<script>" not in page_response.text  # nothing inline: the policy forbids it
    assert httpx.get(f"{corral.url}/api/v1/docs/assets/../admin-token").status_code == 404

    requests: list[str] = []
    page = browsing.page
    page.on("request", lambda request: requests.append(request.url))
    page.goto(f"{corral.url}/docs")
    page.get_by_text("/api/v1/workloads", exact=True).first.wait_for()
    assert page.url == f"{corral.url}/api/v1/docs"
    # Every file came from corral: nothing from elsewhere.
    assert requests and all(url.startswith(corral.url) for url in requests), requests
    # The document's operations are listed, with the bearer scheme to authorize with.
    assert page.locator(".opblock").count() > 20
    assert page.locator("button.authorize").count() == 1
    assert browsing.errors == []


def test_the_docs_leave_the_api_behind_its_token(corral: Corral) -> None:
    assert httpx.get(f"{corral.url}/api/v1/workloads").status_code == 401
    assert httpx.get(f"{corral.url}/api/v1/openapi.json").status_code == 200
