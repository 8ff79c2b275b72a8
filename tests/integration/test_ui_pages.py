"""The dashboard's answers over real HTTP, without a browser: who may see a page, what its
cookie holds, and that errors are pages a person reads (the browser tests are
tests/acceptance/test_ui.py)."""

from __future__ import annotations

import html
import json
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx

from conveyor import wiring
from conveyor.api import create_app
from conveyor.config import Settings
from conveyor.engine import credentials
from conveyor.service import Conveyor
from conveyor.ui.sessions import COOKIE
from tests.integration.conftest import served
from tests.support.services import wait_for

MakeKey = Callable[[str], str]
FLOW = {"name": "one", "nodes": [{"id": "a", "type": "python",
                                  "config": {"function": "test.noop"}}]}  # fmt: skip


@contextmanager
def _signed_in(api_url: str, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_url, timeout=30) as browser:
        answer = browser.post("/ui/signin", data={"key": key, "next": "/ui/executions"})
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/executions"
        yield browser


def _csrf(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def _finished(
    api: httpx.Client, service: Conveyor, flow: dict[str, Any], body: dict[str, Any]
) -> str:
    """Apply ``flow`` (if new), start it with ``body`` and wait for it to finish; its id."""
    assert api.post("/v1/workflows", json=flow).status_code in (200, 201)
    made = api.post(f"/v1/workflows/{flow['name']}/executions", json=body).json()["id"]
    wait_for(service, uuid.UUID(made))
    return str(made)


def test_a_page_without_a_session_asks_to_sign_in_and_a_bad_key_is_told_so(api_url: str) -> None:
    with httpx.Client(base_url=api_url, timeout=30) as browser:
        answer = browser.get("/ui/executions")
        assert answer.status_code == 303
        assert answer.headers["location"] == "/ui/signin?next=%2Fui%2Fexecutions"

        refused = browser.post("/ui/signin", data={"key": "cvk_nope_nope"})
        assert refused.status_code == 401
        assert "unknown or revoked" in refused.text
        assert COOKIE not in refused.cookies


def test_the_session_cookie_is_httponly_samesite_strict_and_holds_no_key(
    api_url: str, make_key: MakeKey
) -> None:
    key = make_key("cookies")
    with _signed_in(api_url, key) as browser:
        set_cookie = browser.cookies.jar
        header = next(c for c in set_cookie if c.name == COOKIE)
        assert header.has_nonstandard_attr("HttpOnly")
        assert header.get_nonstandard_attr("SameSite") in ("Strict", "strict")
        assert key not in str(header.value) and key.split("_")[2] not in str(header.value)
        assert browser.get("/ui/executions").status_code == 200


def test_a_revoked_key_ends_its_sessions_at_once(
    api_url: str, make_key: MakeKey, conveyor_service: Conveyor
) -> None:
    key = make_key("revoked")
    with _signed_in(api_url, key) as browser:
        with conveyor_service.db.transaction() as store:
            tenant_id = store.tenant_id("revoked")
            store.revoke_api_key(tenant_id, credentials.key_prefix(key), datetime.now(UTC))

        assert browser.get("/ui/executions").status_code == 303


def test_another_api_process_reads_the_session_and_a_sign_out_ends_every_copy_of_it(
    api_url: str, make_key: MakeKey
) -> None:
    # Given a second API process on the same database, neither with CONVEYOR_UI_SECRET, and
    # two sessions of one key (the second sign-in leaves the first signed in)
    key = make_key("moving")
    second = create_app(wiring.service(), Settings(ui_secret=""))
    with (
        served(second) as second_url,
        _signed_in(api_url, key) as browser,
        _signed_in(api_url, key) as colleague,
    ):
        cookie = str(browser.cookies.get(COOKIE))
        with httpx.Client(base_url=second_url, timeout=30) as elsewhere:
            elsewhere.cookies.set(COOKIE, cookie, path="/ui")
            # When the session's next request reaches the other process
            there = elsewhere.get("/ui/executions")
            # and the person signs out there, a copy of the cookie kept, then signs in again
            signed_out = elsewhere.post("/ui/signout", data={"csrf": _csrf(there)})
        colleagues = colleague.get("/ui/executions")
        again = browser.post("/ui/signin", data={"key": key})
        renewed = browser.get("/ui/executions")
        # Then the copy opens no page on either process, and posts nothing
        for url in (api_url, second_url):
            with httpx.Client(base_url=url, timeout=30, cookies={COOKIE: cookie}) as copy:
                after = copy.get("/ui/executions")
                posted = copy.post("/ui/signout", data={"csrf": _csrf(there)})
            assert after.status_code == 303, url
            assert after.headers["location"].startswith("/ui/signin")
            assert posted.status_code == 303 and posted.headers["location"].startswith("/ui/s")
    assert there.status_code == 200 and 'id="tenant">tenant moving' in there.text
    assert signed_out.status_code == 303
    # and the sign-out ended the key's other session too; the new sign-in's session works
    assert colleagues.status_code == 303
    assert again.status_code == 303 and renewed.status_code == 200


def test_errors_are_pages_a_person_reads_never_a_stack_trace(
    api_url: str, make_key: MakeKey, conveyor_service: Conveyor
) -> None:
    key = make_key("errors")
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}) as api:
        made = _finished(api, conveyor_service, FLOW, {})
    with _signed_in(api_url, key) as browser:
        for path in ("/ui/executions/not-an-id", "/ui/no-such-page", "/ui/workflows/nope"):
            answer = browser.get(path)
            assert answer.status_code == 404, path
            assert "<h1>Not found</h1>" in answer.text and "Traceback" not in answer.text

        # cancelling a finished execution: refused, with the reason
        page = browser.get(f"/ui/executions/{made}")
        done = browser.post(f"/ui/executions/{made}/cancel", data={"csrf": _csrf(page)})
        assert done.status_code == 409
        assert "Could not do that" in done.text and "completed" in done.text


MAP = {
    "name": "priced",
    "nodes": [
        {"id": "price", "type": "python", "config": {"function": "test.add"},
         "map": {"over": "{{ input.numbers }}"}, "inputs": {"a": "{{ item }}", "b": 1}},
        {"id": "total", "type": "python", "needs": ["price"],
         "config": {"function": "test.noop"}},
    ],
}  # fmt: skip


def test_a_map_node_is_drawn_as_one_node_with_its_items_counts(
    api_url: str, make_key: MakeKey, conveyor_service: Conveyor
) -> None:
    key = make_key("maps")
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}) as api:
        made = _finished(api, conveyor_service, MAP, {"input": {"numbers": [1, 2, 3]}})
    with _signed_in(api_url, key) as browser:
        page = browser.get(f"/ui/executions/{made}").text

    assert page.count('class="node status-') == 2  # the map's three items are not nodes
    assert "completed · 3/3 items" in page
    assert "3 items: 3 completed" in page


BOOM = {
    "name": "boom",
    "nodes": [{"id": "n", "type": "python", "config": {"function": "test.fail"},
               "inputs": {"message": "<script>alert('owned')</script>"}}],
}  # fmt: skip


def test_a_rerun_and_a_discard_from_the_pages_are_recorded_as_the_api_records_them(
    api_url: str, make_key: MakeKey, conveyor_service: Conveyor
) -> None:
    # Given two failed executions of a node whose error holds markup
    key = make_key("actions")
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}) as api:
        made = [_finished(api, conveyor_service, BOOM, {"max_attempts": 1}) for _ in range(2)]
        with _signed_in(api_url, key) as browser:
            # Then the error shows as text, never as markup
            page = browser.get(f"/ui/executions/{made[0]}")
            assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in page.text
            assert "<script>alert" not in page.text

            # When the first is rerun from its node and the second's dead letter discarded
            rerun = browser.post(
                f"/ui/executions/{made[0]}/rerun", data={"csrf": _csrf(page), "from_node": "n"}
            )
            assert rerun.status_code == 303
            letters = browser.get("/ui/dead-letters")
            second = api.get(f"/v1/executions/{made[1]}").json()["jobs"][-1]["id"]
            discarded = browser.post(
                "/ui/dead-letters/discard", data={"csrf": _csrf(letters), "job_id": second}
            )
            assert discarded.status_code == 303
            assert browser.get(discarded.headers["location"]).text.count("Discarded 1.") == 1

        # Then the API shows the rerun by the key's name, and the letter in the archive
        reruns = api.get(f"/v1/executions/{made[0]}").json()["reruns"]
        assert [(r["from_node"], r["requested_by"]) for r in reruns] == [("n", "test")]
        archive = api.get("/v1/dead-letters", params={"archived": "true"}).json()
        assert [d["job_id"] for d in archive] == [second]


def test_the_search_box_finds_an_execution_by_id_idempotency_key_or_dedupe_key(
    api_url: str, make_key: MakeKey, conveyor_service: Conveyor
) -> None:
    key = make_key("finding")
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}) as api:
        assert api.post("/v1/workflows", json=FLOW).status_code == 201
        made = api.post(
            "/v1/workflows/one/executions", json={"dedupe_key": "order-7"},
            headers={"Idempotency-Key": "idem-1"},
        ).json()["id"]  # fmt: skip
        other = api.post("/v1/workflows/one/executions", json={}).json()["id"]
    with _signed_in(api_url, key) as browser:
        by_id = browser.get("/ui/executions", params={"find": made})
        assert by_id.status_code == 303 and by_id.headers["location"] == f"/ui/executions/{made}"
        for text in ("idem-1", "order-7"):
            page = browser.get("/ui/executions", params={"find": text}).text
            assert f'data-id="{made}"' in page and f'data-id="{other}"' not in page, text
        assert "data-id=" not in browser.get("/ui/executions", params={"find": "nope"}).text


def test_a_sign_in_posted_by_another_site_is_refused(api_url: str, make_key: MakeKey) -> None:
    # (login CSRF: a hostile page would sign its visitor into the attacker's tenant)
    key = make_key("elsewhere")
    with httpx.Client(base_url=api_url, timeout=30) as browser:
        for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
            refused = browser.post("/ui/signin", data={"key": key}, headers=headers)
            assert refused.status_code == 403, headers
            assert "another site" in refused.text
            assert COOKIE not in refused.cookies
        same = browser.post("/ui/signin", data={"key": key}, headers={"Origin": api_url})
        assert same.status_code == 303 and COOKIE in same.cookies


def test_a_forged_cookie_or_token_that_is_not_ascii_is_refused_not_a_server_error(
    api_url: str, make_key: MakeKey
) -> None:
    with _signed_in(api_url, make_key("ascii")) as browser:
        assert browser.post("/ui/signout", data={"csrf": "é"}).status_code == 403
    with httpx.Client(base_url=api_url, timeout=30) as stranger:
        forged = f"{COOKIE}=e30.é".encode()
        answer = stranger.get("/ui/executions", headers={b"Cookie": forged})
        assert answer.status_code == 303 and answer.headers["location"].startswith("/ui/signin")


FED = {
    "name": "fed",
    "nodes": [
        {"id": "a", "type": "python", "config": {"function": "test.add"},
         "inputs": {"a": "{{ input.x }}", "b": 2}},
        {"id": "b", "type": "python", "needs": ["a"], "config": {"function": "test.fail"},
         "inputs": {"message": "{{ input.text }} then {{ nodes.a.sum }}"}},
        {"id": "c", "type": "python", "needs": ["a", "b"], "config": {"function": "test.add"},
         "inputs": {"a": "{{ nodes.a.sum }}", "b": 1}},
        {"id": "m", "type": "python", "config": {"function": "test.add"},
         "map": {"over": "{{ input.ones }}"}, "inputs": {"a": "{{ item }}", "b": "{{ index }}"}},
    ],
}  # fmt: skip


def _inputs_shown(page: str, node: str) -> tuple[str, Any]:
    """How a node's inputs section says they were made, and what it shows: the value, the
    text of a cut one, or None."""
    found = re.search(
        rf'data-inputs="{node}"><summary>inputs \(([^)]*)\)</summary>\s*(?:<pre>(.*?)</pre>)?',
        page, re.DOTALL,
    )  # fmt: skip
    assert found is not None, node
    text = html.unescape(found.group(2)) if found.group(2) is not None else None
    try:
        return found.group(1), json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return found.group(1), text


def test_each_node_shows_its_inputs_as_rendered_a_large_one_cut_and_fetched_by_its_tenant_only(
    api_url: str, make_key: MakeKey, conveyor_service: Conveyor
) -> None:
    # Given an execution whose node b was given a long message and failed, so c never ran
    key, other = make_key("inputs"), make_key("inputs-other")
    text = "x" * 3_000
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}) as api:
        made = _finished(api, conveyor_service, FED, {"input": {"x": 40, "text": text, "ones": [1]},
                                                      "max_attempts": 1})  # fmt: skip
    whole = f"/ui/executions/{made}/value?node=b&part=inputs"
    with _signed_in(api_url, key) as browser:
        page = browser.get(f"/ui/executions/{made}").text
        fetched = browser.get(whole)

    # Then a's inputs show rendered from the execution's input, b's cut with a link to them
    section = {n: _inputs_shown(page, n) for n in "abcm"}
    assert section["a"] == ("rendered", {"a": 40, "b": 2})
    how, cut = section["b"]
    assert how == "rendered" and isinstance(cut, str) and len(cut) == 2_000
    assert cut.startswith('{\n  "message": "xxx') and f'href="{html.escape(whole)}"' in page
    assert section["c"] == ("none: the node was cancelled before it ran", None)
    assert section["m"] == ("templates, rendered for each item", {"a": "{{ item }}",
                                                                  "b": "{{ index }}"})  # fmt: skip
    # And the whole of b's inputs is there for its tenant, rendered with a's output
    assert fetched.status_code == 200
    assert fetched.json() == {"message": f"{text} then 42"}
    # And another tenant's session gets a 404, as for an unknown id
    with _signed_in(api_url, other) as stranger:
        refused = stranger.get(whole)
    assert refused.status_code == 404 and text not in refused.text
