"""The dashboard (/ui) in a real headless Chromium (Debian's, driven through its chromedriver;
nothing is downloaded), served by `conveyor api` in its own process with real `celery worker`
processes on PostgreSQL and Redis.

Screenshots of each page are saved under the test's tmp path and under ./artifacts/ui (ignored
by git); the docs' pictures (docs/ui/) are copies of them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from conveyor.engine import credentials
from conveyor.engine.states import ExecutionStatus
from conveyor.service import Conveyor
from conveyor.store.sql_store import SqlStore
from tests.acceptance.conftest import ROOT, _wait_until_ready
from tests.acceptance.test_api import serving_api
from tests.acceptance.test_cli import CONVEYOR, conveyor

Start = Callable[..., subprocess.Popen[str]]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
QUEUES = "workflow-webhook,workflow-execution,workflow-node"
WAIT = 60  # seconds a page is given to show what the workers did


@pytest.fixture
def browser(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WebDriver]:
    """Headless Chromium from Debian's packages; selenium-manager is never asked for one."""
    for program in (CHROMIUM, CHROMEDRIVER):
        assert os.path.exists(program), f"{program} is missing: apt-get install chromium " \
            "chromium-driver (.ci/run does)"  # fmt: skip
    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium-manager must not download a thing
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)  # fmt: skip
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def api(acceptance_env: dict[str, str], tmp_path: Path, client: Conveyor) -> Iterator[str]:
    env = {**acceptance_env, "CONVEYOR_IMPORTS": "tests.support.nodes"}
    with serving_api(env, tmp_path) as url:
        yield url


class Shots:
    """Screenshots as test artifacts: the test's tmp path, and ./artifacts/ui."""

    def __init__(self, driver: WebDriver, tmp_path: Path) -> None:
        self.driver, self.folders = driver, [tmp_path / "screenshots", ROOT / "artifacts" / "ui"]
        for folder in self.folders:
            folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, name: str) -> None:
        first = self.folders[0] / f"{name}.png"
        assert self.driver.save_screenshot(str(first))
        for folder in self.folders[1:]:
            shutil.copy(first, folder / first.name)


def _key(client: Conveyor, tenant: str) -> str:
    """A new API key of ``tenant`` (made if new), as `conveyor keys create` makes it."""
    made = credentials.new_api_key()

    def add(store: SqlStore) -> None:
        if tenant not in store.tenant_names():
            store.create_tenant(tenant)
        store.add_api_key(
            store.tenant_id(tenant), f"{tenant}-ops", made.prefix, made.digest, datetime.now(UTC)
        )

    client.db.run(add)
    return made.key


def _http(api: str, key: str, request: pytest.FixtureRequest) -> httpx.Client:
    http = httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    request.addfinalizer(http.close)
    return http


def _sign_in(driver: WebDriver, api: str, key: str) -> None:
    driver.get(f"{api}/ui")
    assert "/ui/signin" in driver.current_url  # no session: the sign-in page
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.ID, "signin").click()
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.ID, "tenant"))


def _node_status(driver: WebDriver, node: str) -> str:
    """The node's box's classes. Read again if the page redrew the box (the live stream) or
    reloaded between finding it and reading it: "does not belong to the document"."""
    deadline = time.monotonic() + 10
    while True:
        try:
            box = driver.find_element(By.CSS_SELECTOR, f'g.node[data-node="{node}"]')
            return str(box.get_attribute("class"))
        except WebDriverException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _trigger(http: httpx.Client, workflow: str, body: dict[str, object]) -> str:
    answer = http.post(f"/v1/workflows/{workflow}/executions", json=body)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


DIAMOND = {
    "name": "diamond",
    "description": "One node fans out to three that join into one.",
    "nodes": [
        {"id": "start", "type": "python", "config": {"function": "test.wait_for_file"},
         "inputs": {"path": "{{ input.path }}"}},
        *[{"id": n, "type": "python", "needs": ["start"], "config": {"function": "test.add"},
           "inputs": {"a": 1, "b": i}} for i, n in enumerate(["left", "middle", "right"])],
        {"id": "join", "type": "python", "needs": ["left", "middle", "right"],
         "config": {"function": "test.add"},
         "inputs": {"a": "{{ nodes.left.sum }}", "b": "{{ nodes.right.sum }}"}},
    ],
    "schedules": [{"name": "nightly-diamond", "cron": "0 2 * * *",
                   "input": {"path": "/nonexistent"}}],
}  # fmt: skip
RELEASE = {
    "name": "release",
    "nodes": [
        {"id": "build", "type": "python", "config": {"function": "test.wait_for_file"},
         "inputs": {"path": "{{ input.path }}"}},
        {"id": "sign-off", "type": "approval", "needs": ["build"],
         "config": {"message": "Ship it?"}},
        {"id": "ship", "type": "python", "needs": ["sign-off"], "config": {"function": "test.add"},
         "inputs": {"a": 1, "b": 2}},
    ],
}  # fmt: skip
FRAGILE = {
    "name": "fragile",
    "nodes": [{"id": "charge", "type": "python", "config": {"function": "test.fails_first_run"}}],
}


def test_an_operator_watches_a_diamond_live_requeues_a_failure_pauses_a_schedule_and_approves(
    api: str,
    browser: WebDriver,
    start_worker: Start,
    client: Conveyor,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # Given workers, a tenant's key, a diamond held at its first node and a node that fails once
    start_worker(QUEUES, concurrency=2)
    http = _http(api, _key(client, "acme"), request)
    for flow in (DIAMOND, FRAGILE, RELEASE):
        assert http.post("/v1/workflows", json=flow).status_code == 201
    shot = Shots(browser, tmp_path)
    _sign_in(browser, api, _key(client, "acme"))
    shot("overview")
    gate = tmp_path / "go"
    diamond = _trigger(http, "diamond", {"input": {"path": str(gate)}})

    # When the execution's page is open while its first node runs, and the gate opens
    browser.get(f"{api}/ui/executions/{diamond}")
    WebDriverWait(browser, WAIT).until(lambda d: "status-running" in _node_status(d, "start"))
    assert "status-completed" not in _node_status(browser, "join")
    browser.execute_script("window.stillThisPage = true")
    gate.write_text("go")

    # Then every node turns completed on the same page, without a reload
    WebDriverWait(browser, WAIT).until(
        lambda d: all("status-completed" in _node_status(d, n)
                      for n in ("start", "left", "middle", "right", "join"))
    )  # fmt: skip
    WebDriverWait(browser, WAIT).until(
        lambda d: d.find_element(By.ID, "execution-status").text == "completed"
    )
    assert browser.execute_script("return window.stillThisPage") is True
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.dag path.edge")) == 6
    shot("execution")

    # When a node fails: its page shows the try, its error and its traceback
    fragile = _trigger(http, "fragile", {})
    _await(client, fragile, ExecutionStatus.FAILED)
    browser.get(f"{api}/ui/executions/{fragile}")
    assert "status-failed" in _node_status(browser, "charge")
    error = browser.find_element(By.CSS_SELECTOR, "#node-charge .attempt-error")
    assert "its first run fails" in error.text
    browser.find_element(By.CSS_SELECTOR, "#node-charge details.traceback summary").click()
    traced = browser.find_element(By.CSS_SELECTOR, "#node-charge details.traceback pre").text
    assert traced.startswith("Traceback (most recent call last)")
    assert "in fails_first_run" in traced
    shot("failed-execution")

    # And its dead letter is requeued from the dead letters page: the execution completes
    browser.get(f"{api}/ui/dead-letters")
    row = browser.find_element(By.CSS_SELECTOR, "table.dead-letters tbody tr")
    assert fragile in row.find_element(By.TAG_NAME, "a").get_attribute("href")  # type: ignore[operator]
    shot("dead-letters")
    browser.find_element(By.CSS_SELECTOR, "button.requeue").click()
    assert _text_after_click(browser, By.ID, "note") == "Requeued 1."
    _await(client, fragile, ExecutionStatus.COMPLETED)
    browser.get(f"{api}/ui/executions/{fragile}")
    assert browser.find_element(By.ID, "execution-status").text == "completed"

    # And the diamond's schedule is paused from its workflow's page
    browser.get(f"{api}/ui/workflows/diamond")
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.dag g.node")) == 5
    shot("workflow")
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-schedule="nightly-diamond"]')
    row.find_element(By.TAG_NAME, "button").click()
    state = '[data-schedule="nightly-diamond"] .state'
    assert _text_after_click(browser, By.CSS_SELECTOR, state, "paused") == "paused"
    with client.db.transaction() as store:
        paused = store.schedule(store.tenant_id("acme"), "nightly-diamond")
    assert paused is not None and not paused.enabled

    # And the executions list shows both, filtered by status
    browser.get(f"{api}/ui/executions?status=completed")
    ids = _listed(browser)
    assert set(ids) == {diamond, fragile}
    shot("executions")
    browser.get(f"{api}/ui/executions/{uuid.uuid4()}")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Not found"

    # When a release's page is open while it builds, then its sign-off waits (the page reloads
    # itself to show the buttons), and it is approved there with a comment
    built = tmp_path / "built"
    release = _trigger(http, "release", {"input": {"path": str(built)}})
    browser.get(f"{api}/ui/executions/{release}")
    WebDriverWait(browser, WAIT).until(lambda d: "status-running" in _node_status(d, "build"))
    built.write_text("go")
    WebDriverWait(browser, WAIT, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, '[data-approval="sign-off"] button.approve')
    )
    assert "status-waiting" in _node_status(browser, "sign-off")
    # (the approvals list, an approver's work queue, shows it with its buttons too)
    browser.get(f"{api}/ui/approvals")
    row = browser.find_element(By.CSS_SELECTOR, "#approvals tbody tr")
    assert "sign-off" in row.text and row.find_elements(By.CSS_SELECTOR, "button.approve")
    shot("approvals")
    browser.get(f"{api}/ui/executions/{release}")
    box = browser.find_element(By.CSS_SELECTOR, '[data-approval="sign-off"]')
    assert "Ship it?" in box.text
    box.find_element(By.NAME, "comment").send_keys("looks good")
    shot("approval")
    box.find_element(By.CSS_SELECTOR, "button.approve").click()

    # Then the page says so, the sign-off is completed and the release runs to its end
    assert _text_after_click(browser, By.ID, "note") == "Approved sign-off."
    assert "status-completed" in _node_status(browser, "sign-off")
    WebDriverWait(browser, WAIT).until(
        lambda d: d.find_element(By.ID, "execution-status").text == "completed"
    )
    nodes = client.execution(release, tenant="acme")["nodes"]
    decided = next(n["output"] for n in nodes if n["id"] == "sign-off")
    assert (decided["decision"], decided["by"], decided["comment"]) == (
        "approved", "key:acme-ops", "looks good",
    )  # fmt: skip


def _await(client: Conveyor, execution_id: str, status: ExecutionStatus) -> None:
    def reached(_: object) -> bool:
        return _status(client, execution_id, "acme") == status.value

    WebDriverWait(None, WAIT, poll_frequency=0.2).until(reached)  # type: ignore[arg-type]


def _text_after_click(driver: WebDriver, by: str, where: str, wanted: str | None = None) -> str:
    """The text of an element of the page a click leads to (the old page's elements go
    stale as it loads), once it is ``wanted`` if given; the last text read, if it never is."""
    seen: list[str] = []

    def read(d: WebDriver) -> bool:
        seen.append(d.find_element(by, where).text)
        return wanted is None or seen[-1] == wanted

    with contextlib.suppress(TimeoutException):
        WebDriverWait(
            driver, 10, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
        ).until(read)
    return seen[-1] if seen else ""


def _status(client: Conveyor, execution_id: str, tenant: str) -> str:
    return client.execution(execution_id, tenant=tenant)["status"]


def _listed(driver: WebDriver) -> list[str | None]:
    rows = driver.find_elements(By.CSS_SELECTOR, "#executions tbody tr[data-id]")
    return [r.get_attribute("data-id") for r in rows]


def _post(driver: WebDriver, path: str, form: dict[str, str]) -> tuple[int, str]:
    """A form post made by a script on the page (the session's cookie goes with it)."""
    answer = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {method: 'POST', body: new URLSearchParams(arguments[1]),"
        " redirect: 'manual'}).then(r => r.text().then(t => done([r.status, t])));",
        path,
        form,
    )
    return int(answer[0]), str(answer[1])


def test_a_tenants_session_sees_none_of_another_tenants_executions_and_cannot_act_on_them(
    api: str,
    browser: WebDriver,
    client: Conveyor,
    request: pytest.FixtureRequest,
) -> None:
    # Given an execution of tenant beta and one of acme (no worker: they stay unfinished),
    # and acme's session
    beta = _http(api, _key(client, "beta"), request)
    assert beta.post("/v1/workflows", json=FRAGILE).status_code == 201
    theirs = _trigger(beta, "fragile", {})
    acme = _http(api, _key(client, "acme"), request)
    assert acme.post("/v1/workflows", json=FRAGILE).status_code == 201
    ours = _trigger(acme, "fragile", {})
    _sign_in(browser, api, _key(client, "acme"))
    before = {
        e: client.execution(e, tenant=t)["status"] for e, t in [(theirs, "beta"), (ours, "acme")]
    }

    # Then acme's list shows its execution only, and beta's page is a 404 page
    browser.get(f"{api}/ui/executions")
    ids = _listed(browser)
    assert ids == [ours]
    browser.get(f"{api}/ui/executions?find={theirs}")
    assert _listed(browser) == []
    browser.get(f"{api}/ui/executions/{theirs}")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Not found"

    # When acme's page forges posts against beta's execution, with and without its CSRF token
    browser.get(f"{api}/ui/executions/{ours}")
    csrf = browser.find_element(By.NAME, "csrf").get_attribute("value") or ""
    assert csrf
    assert _post(browser, f"/ui/executions/{theirs}/cancel", {"csrf": csrf})[0] == 404
    assert _post(browser, f"/ui/executions/{theirs}/cancel", {})[0] == 403
    assert _post(browser, f"/ui/executions/{ours}/cancel", {"csrf": "forged"})[0] == 403
    assert _post(browser, "/ui/schedules/nightly/pause", {"csrf": csrf})[0] == 404

    # Then beta's execution, and acme's own, are as they were; a post with the token acts
    assert _status(client, theirs, "beta") == before[theirs] != "cancelled"
    assert _status(client, ours, "acme") == before[ours] != "cancelled"
    assert _post(browser, f"/ui/executions/{ours}/cancel", {"csrf": csrf})[0] in (0, 303)
    assert _status(client, ours, "acme") == "cancelled"
    # And without a session (another browser), every page asks to sign in
    signed_out = httpx.post(f"{api}/ui/executions/{ours}/cancel", data={"csrf": csrf})
    assert signed_out.status_code == 303
    assert signed_out.headers["location"].startswith("/ui/signin")


def test_an_operator_key_from_the_cli_sees_every_tenant_and_the_operators_charts(
    api: str,
    browser: WebDriver,
    client: Conveyor,
    acceptance_env: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # Given an unfinished execution of each of two tenants (no worker: their messages wait)
    made = {}
    for tenant in ("beta", "acme"):
        http = _http(api, _key(client, tenant), request)
        assert http.post("/v1/workflows", json=FRAGILE).status_code == 201
        made[tenant] = _trigger(http, "fragile", {})
    # and an operator's key, made by the CLI
    key = conveyor("keys", "create", "--operator", "--name", "ops", env=acceptance_env)
    assert "operator key" in key.stderr
    shot = Shots(browser, tmp_path)

    # When the operator signs in
    _sign_in(browser, api, key.stdout.strip())

    # Then the overview draws the process-wide charts from its figures (the queued messages)
    WebDriverWait(browser, WAIT).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-queues rect")
    )
    assert browser.find_element(By.ID, "operator").text == "operator"
    shot("operator-overview")
    # and the executions list shows both tenants', with their tenant, and filters by tenant
    browser.get(f"{api}/ui/executions")
    assert set(_listed(browser)) == set(made.values())
    tenants = {c.text for c in browser.find_elements(By.CSS_SELECTOR, "#executions td.tenant")}
    assert tenants == {"beta", "acme"}
    shot("operator-executions")
    browser.get(f"{api}/ui/executions?tenant=beta")
    assert _listed(browser) == [made["beta"]]


def test_conveyor_ui_serves_the_dashboard_on_the_embedded_default_with_a_key_to_sign_in(
    tmp_path: Path,
) -> None:
    # Given an empty directory and no CONVEYOR_* settings: SQLite and worker threads in-process
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "ui.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [*CONVEYOR, "ui", "--port", str(port)], cwd=tmp_path, env=env, text=True,
            stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    try:
        # When it is up, the key it printed signs in
        _wait_until_ready(process, log, "Uvicorn running on")
        key = re.search(r"\bcvk_\S+", log.read_text())
        assert key is not None, log.read_text()
        assert f"http://127.0.0.1:{port}/ui" in log.read_text()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as browser:
            signed = browser.post("/ui/signin", data={"key": key.group(0)})
            assert signed.status_code == 303, signed.text
            # Then the overview of the default tenant is served
            page = browser.get("/ui")
            assert page.status_code == 200 and "tenant default" in page.text
    finally:
        process.terminate()
        process.wait(timeout=20)
