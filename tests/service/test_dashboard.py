"""The dashboard in a real browser (Debian's chromium driven by Playwright) against the
embedded service: enter a key, submit a zoo job from the page, watch its progress chart
grow, open the plan, check the timeline's GPUs and the memory bars against the API,
download the GraphDef and parse it; a key that is not accepted sees an error, a key of
another tenant sees none of the jobs. Screenshots of every page are kept as artifacts
(``TAGPLAN_TEST_ARTIFACTS``, default ``test-artifacts/`` at the repository root)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tagplan.db.keys import create_key
from tagplan.db.session import session_scope
from tagplan.planner.graph.protos import GraphDef
from tests.backends import CHROMIUM_ARGS, environment_without_settings, free_port
from tests.workers.conftest import wait_ready

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(
    os.environ.get("TAGPLAN_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")
)

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed (the test command installs it)",
)


class Service:
    def __init__(self, url: str, database_url: str) -> None:
        self.url, self.database_url = url, database_url

    def key(self, *scopes: str, tenant: str) -> str:
        with session_scope(self.database_url) as session:
            _, token = create_key(session, scopes=scopes, name=f"{tenant}-key", tenant=tenant)
        return token


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """``tagplan serve`` on its embedded defaults (SQLite, the worker in-process)."""
    data = tmp_path_factory.mktemp("dashboard")
    port = free_port()
    env = {**environment_without_settings(), "TAGPLAN_DATA_DIR": str(data)}
    log = (data / "api.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tagplan", "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, data, timeout_s=90)
        yield Service(url, f"sqlite:///{(data / 'tagplan.db').resolve()}")
    finally:
        process.terminate()
        process.wait(30)
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser, request) -> Iterator[object]:
    """A fresh tab at 1400 x 1000; console errors fail the test; a screenshot at the end."""
    # the page's CSP forbids eval, which Playwright's wait_for_function uses: the test's
    # probes bypass it (the header itself is checked in test_the_page_may_load_only_itself)
    context = browser.new_context(
        viewport={"width": 1400, "height": 1000}, accept_downloads=True, bypass_csp=True
    )
    tab = context.new_page()
    errors: list[str] = []
    tab.on(
        "console", lambda message: errors.append(message.text) if message.type == "error" else None
    )
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.console_errors = errors
    yield tab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()


def _use_key(page, service: Service, key: str) -> None:
    page.goto(f"{service.url}/ui/")
    page.fill("#key-input", key)
    page.click("#key-use")


def _unexpected(errors: list[str]) -> list[str]:
    """Console errors other than the failed requests a test provokes on purpose."""
    return [e for e in errors if "status of 40" not in e]


def test_a_key_that_is_not_accepted_sees_an_error_and_no_data(page, service: Service) -> None:
    _use_key(page, service, "tpk_not_a_key")
    page.wait_for_selector("#error:not([hidden])")
    assert "not accepted" in page.inner_text("#error")
    assert page.query_selector("#jobs") is None


def test_submit_watch_open_and_download_a_plan(page, service: Service, tmp_path) -> None:
    key = service.key("admin", tenant="ui")
    api = httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    _use_key(page, service, key)
    page.wait_for_selector("#submit-form")
    page.select_option("#submit-model", "vgg19")
    page.select_option("#submit-cluster", "testbed")
    page.fill("#submit-budget", "12")
    page.click("#submit-form button[type=submit]")
    page.wait_for_url("**/ui/#/jobs/*")
    job_id = page.url.rsplit("/", 1)[1]

    # the progress chart grows while the search runs
    page.wait_for_selector("#progress-line", timeout=60_000)
    first = int(page.get_attribute("#progress-chart svg", "data-points"))
    page.wait_for_function(
        f"document.querySelector('#progress-chart svg').dataset.points > {first}"
        " || document.querySelector('#job-status').textContent === 'succeeded'",
        timeout=60_000,
    )
    page.wait_for_selector("#job-status:text('succeeded')", timeout=120_000)
    page.wait_for_selector("#memory .memory-row")

    # the timeline has a lane for every GPU of the cluster
    layout = api.get(
        f"/v1/clusters/{api.get(f'/v1/jobs/{job_id}').json()['cluster_id']}/layout"
    ).json()
    page.wait_for_selector("#timeline-canvas[data-lanes]")
    lanes = page.eval_on_selector_all(".lane-name.device", "nodes => nodes.map(n => n.textContent)")
    assert sorted(lanes) == sorted(d["name"] for d in layout["devices"])
    assert len(layout["devices"]) == 16

    # the memory bars show the API's numbers
    result = api.get(f"/v1/jobs/{job_id}/result").json()
    rows = page.eval_on_selector_all(
        "#memory .memory-row",
        "rows => rows.map(r => [r.dataset.device, Number(r.dataset.peakBytes)])",
    )
    assert dict(rows) == result["peak_memory_bytes"]
    bars = page.eval_on_selector_all(
        "#baseline-chart rect", "rects => rects.map(r => [r.dataset.name, Number(r.dataset.stepS)])"
    )
    assert dict(bars)["tagplan"] == pytest.approx(result["step_time_s"])
    assert len(page.query_selector_all("#strategy tbody tr")) == len(result["strategy"]["groups"])
    assert page.inner_text("#plan-prior") == f"prior {result['prior']}"

    # the GraphDef downloads (the key in a header, not the URL) and parses
    with page.expect_download() as download:
        page.click("#dl-graphdef")
    saved = tmp_path / "plan.pb"
    download.value.save_as(saved)
    graph = GraphDef.FromString(saved.read_bytes())
    assert len(graph.node) > 0 and any("task:" in node.device for node in graph.node)

    # zoom into the first tenth of the step, then back
    box = page.query_selector("#timeline-canvas").bounding_box()
    page.mouse.move(box["x"] + 2, box["y"] + 10)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 10, box["y"] + 10)
    page.mouse.up()
    page.wait_for_function("document.querySelector('.lane-name') !== null")
    page.click("#timeline-reset")
    page.wait_for_timeout(500)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "job-page.png"), full_page=True)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(ARTIFACTS / "job-page-top.png"))
    assert _unexpected(page.console_errors) == []

    page.goto(f"{service.url}/ui/#/jobs")
    page.wait_for_selector(f"tr[data-job='{job_id}']")
    assert "succeeded" in page.inner_text(f"tr[data-job='{job_id}']")
    assert "ui-key" in page.inner_text(f"tr[data-job='{job_id}']")


def test_another_tenant_sees_none_of_the_jobs(page, service: Service) -> None:
    owner = service.key("submit", tenant="owner")
    job = httpx.post(
        f"{service.url}/v1/jobs",
        json={"graph": {"zoo": "mlp"}, "cluster": "testbed", "options": {"budget_s": 2}},
        headers={"Authorization": f"Bearer {owner}"},
    ).json()
    _use_key(page, service, service.key("read", tenant="stranger"))
    page.wait_for_selector("#jobs")
    page.wait_for_function("document.querySelector('#job-counts').textContent.length > 0")
    assert page.query_selector_all("#jobs tbody tr") == []
    page.goto(f"{service.url}/ui/#/jobs/{job['id']}")
    page.wait_for_selector("#error:not([hidden])")
    assert "404" in page.inner_text("#error")
    assert page.query_selector("#job-done .card") is None


def test_the_operators_page(page, service: Service) -> None:
    key = service.key("operate", tenant="ops")
    checkpoint = httpx.post(
        f"{service.url}/v1/checkpoints?name=ui-prior",
        content=b"weights",
        headers={"Authorization": f"Bearer {key}"},
    ).json()
    _use_key(page, service, key)
    page.goto(f"{service.url}/ui/#/operate")
    page.wait_for_selector("#active-prior")
    assert "ready: ok" in page.inner_text("#health")
    assert "V100" in page.inner_text("#gpu-types")
    assert "testbed" in page.inner_text("#named-clusters")
    assert page.query_selector("#profile-file") is not None  # operators may upload
    assert "shipped checkpoint (gnn:" in page.inner_text("#active-prior")
    page.click(f"tr[data-checkpoint='{checkpoint['id']}'] button")  # activate it
    page.wait_for_selector("#active-prior:has-text('Active: ui-prior')")
    page.click("#checkpoint-clear")  # and back to the shipped one
    page.wait_for_selector("#active-prior:has-text('shipped checkpoint')")
    page.wait_for_timeout(2500)  # the jobs page the key was entered on had started loading
    assert page.query_selector("#jobs") is None
    assert _unexpected(page.console_errors) == []


def test_the_page_may_load_only_itself(service: Service) -> None:
    response = httpx.get(f"{service.url}/ui/")
    assert response.status_code == 200 and "app.js" in response.text
    policy = response.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy
    assert httpx.get(f"{service.url}/", follow_redirects=False).headers["location"] == "/ui/"
