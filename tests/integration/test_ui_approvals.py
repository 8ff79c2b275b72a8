"""The dashboard's approvals and an operator's workflows over real HTTP: a decision made from
an execution's page is recorded as the API records one (the key's name, when, the comment), a
second one is told so, a forged or token-less post changes nothing, an operator decides any
tenant's approval under its own key's name; an operator's workflows list spans every tenant."""

from __future__ import annotations

import html
import re
import uuid

import httpx

from conveyor.engine.states import ExecutionStatus
from conveyor.service import Conveyor
from tests.conftest import TEST_DB_URL
from tests.integration.test_approvals import export_flow, node_output, waiting
from tests.integration.test_ui_operators import FLOW, MakeKey, _csrf, _signed_in
from tests.integration.test_waits import until
from tests.support.services import effects, wait_for


def _waiting_export(service: Conveyor, tenant: str) -> tuple[uuid.UUID, uuid.UUID]:
    """An export of ``tenant`` waiting for approval: its execution's id and the approval's."""
    export_flow(service, tenant)
    execution_id = service.trigger("export", {}, tenant=tenant)
    until(lambda: any(p.execution_id == execution_id for p in service.approvals(tenant)))
    (pending,) = [p for p in service.approvals(tenant) if p.execution_id == execution_id]
    return execution_id, pending.id


def _decide(browser: httpx.Client, approval: uuid.UUID, verb: str, **form: str) -> httpx.Response:
    return browser.post(f"/ui/approvals/{approval}/{verb}", data=form)


def test_an_approval_decided_from_its_page_is_recorded_as_the_apis_and_a_second_is_told_so(
    api_url: str, make_key: MakeKey, conveyor_service: Conveyor
) -> None:
    # Given an export of acme waiting for approval, and acme's session (its key named "test")
    key = make_key("acme")
    execution_id, approval = _waiting_export(conveyor_service, "acme")
    with _signed_in(api_url, key) as browser:
        listed = browser.get("/ui/approvals")
        page = browser.get(f"/ui/executions/{execution_id}")

        # When the approver approves it from the execution's page, with a comment
        made = _decide(browser, approval, "approve", csrf=_csrf(page), comment=" ship it ")
        # and then tries to reject it
        again = _decide(browser, approval, "reject", csrf=_csrf(page))

    # Then it was listed with a link to its execution, and shown with its buttons
    assert f'data-approval="{approval}"' in listed.text
    assert f'href="/ui/executions/{execution_id}#node-approve"' in listed.text
    assert 'data-approval="approve"' in page.text and '<b class="ask">Export?</b>' in page.text
    assert f'action="/ui/approvals/{approval}/approve"' in page.text
    # and the decision is the node's output as the API records it; export ran
    assert made.status_code == 303
    assert made.headers["location"].startswith(f"/ui/executions/{execution_id}?note=Approved")
    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.COMPLETED
    output = node_output(conveyor_service, execution_id, "approve")
    assert (output["decision"], output["by"], output["comment"]) == ("approved", "key:test",
                                                                     "ship it")  # fmt: skip
    assert output["at"]
    assert [e["node_id"] for e in effects(TEST_DB_URL)] == ["export"]
    # and the second decision is a page saying it was decided, changing nothing
    assert again.status_code == 409
    assert "already approved by key:test" in html.unescape(again.text)
    assert "Traceback" not in again.text


def test_a_forged_or_tokenless_decision_changes_nothing_and_a_rejection_follows_on_reject(
    api_url: str, make_key: MakeKey, conveyor_service: Conveyor
) -> None:
    # Given acme's export waiting for approval, and globex's own session
    key = make_key("acme")
    execution_id, approval = _waiting_export(conveyor_service, "acme")
    with _signed_in(api_url, make_key("globex")) as browser:
        token = _csrf(browser.get("/ui/approvals"))
        # When globex posts a decision on acme's approval with its own valid token
        forged = _decide(browser, approval, "approve", csrf=token)
        seen = browser.get("/ui/approvals")
        theirs = browser.get(f"/ui/executions/{execution_id}")
    # Then it is refused as an unknown id, naming nothing of acme's; acme's still waits
    assert forged.status_code == 404 and str(execution_id) not in forged.text
    assert str(approval) not in seen.text and theirs.status_code == 404
    assert waiting(conveyor_service) == 1

    with _signed_in(api_url, key) as browser:
        # When acme's own session posts without the CSRF token, or with a wrong one
        tokenless = _decide(browser, approval, "reject", comment="no")
        wrong = _decide(browser, approval, "reject", csrf="forged")
        assert (tokenless.status_code, wrong.status_code) == (403, 403)
        assert waiting(conveyor_service) == 1  # nothing decided
        # When it rejects with its token
        page = browser.get(f"/ui/executions/{execution_id}")
        rejected = _decide(browser, approval, "reject", csrf=_csrf(page), comment="not now")
    # Then the on_reject branch ran, the rejection the node's output
    assert rejected.status_code == 303
    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.COMPLETED
    output = node_output(conveyor_service, execution_id, "approve")
    assert (output["decision"], output["comment"]) == ("rejected", "not now")
    assert [e["node_id"] for e in effects(TEST_DB_URL)] == ["notify"]


def test_an_operator_decides_another_tenants_approval_under_its_own_keys_name(
    api_url: str, make_key: MakeKey, operator_key: str, conveyor_service: Conveyor
) -> None:
    # Given an export of acme waiting for approval, and an operator's session (tenant ops)
    make_key("acme")
    execution_id, approval = _waiting_export(conveyor_service, "acme")
    with _signed_in(api_url, operator_key) as browser:
        # When the operator lists every tenant's approvals and approves acme's
        listed = browser.get("/ui/approvals")
        page = browser.get(f"/ui/executions/{execution_id}")
        made = _decide(browser, approval, "approve", csrf=_csrf(page))
    # Then it saw acme's with its tenant, and the decision records the operator key's name
    assert f'data-approval="{approval}"' in listed.text
    assert '<td class="tenant">acme</td>' in listed.text
    assert made.status_code == 303
    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.COMPLETED
    output = node_output(conveyor_service, execution_id, "approve")
    assert (output["decision"], output["by"]) == ("approved", "key:operator")
    assert conveyor_service.approvals("acme") == []


def test_an_operator_lists_every_tenants_workflows_opens_any_and_pauses_its_schedule(
    api_url: str, make_key: MakeKey, operator_key: str, conveyor_service: Conveyor
) -> None:
    # Given the workflow "one" in each of red and blue, red's with a schedule
    for tenant in ("red", "blue"):
        headers = {"Authorization": f"Bearer {make_key(tenant)}"}
        flow = {**FLOW, "schedules": [{"name": "nightly", "cron": "0 2 * * *"}]}
        with httpx.Client(base_url=api_url, headers=headers) as api:
            answer = api.post("/v1/workflows", json=flow if tenant == "red" else FLOW)
            assert answer.status_code in (200, 201), answer.text

    with _signed_in(api_url, operator_key) as browser:
        # When the operator opens the workflows list, filtered or not, and red's "one"
        every = browser.get("/ui/workflows").text
        blue = browser.get("/ui/workflows", params={"tenant": "blue"}).text
        red_one = browser.get("/ui/workflows/one", params={"tenant": "red"})
        nobody = browser.get("/ui/workflows/one", params={"tenant": "nobody"})
        # and pauses red's schedule from there
        form = {"csrf": _csrf(red_one), "tenant": "red"}
        paused = browser.post("/ui/schedules/nightly/pause", data=form)
    # Then both tenants' are listed with their tenant and links naming it
    tenants = re.findall(r'<td class="tenant">([^<]*)</td>', every)
    assert {"red", "blue"} <= set(tenants) and 'id="tenant-filter"' in every
    assert 'href="/ui/workflows/one?tenant=red"' in every
    assert re.findall(r'<td class="tenant">([^<]*)</td>', blue) == ["blue"]
    assert red_one.status_code == 200 and "tenant red" in red_one.text
    assert nobody.status_code == 404
    assert paused.status_code == 303
    assert paused.headers["location"].startswith("/ui/workflows/one?tenant=red&note=Paused")
    assert _schedule_enabled(conveyor_service, "red") is False

    # And a tenant's session has no filter: its own workflows only, whatever it asks
    with _signed_in(api_url, make_key("blue")) as browser:
        own = browser.get("/ui/workflows", params={"tenant": "red"}).text
        assert 'id="tenant-filter"' not in own and '<td class="tenant">' not in own
        assert len(re.findall(r"<tr data-workflow=", own)) == 1
        page = browser.get("/ui/workflows/one", params={"tenant": "red"})
        assert page.status_code == 200 and 'data-schedule="nightly"' not in page.text
        # and its forged post naming red resumes nothing (blue has no such schedule)
        forged = {"csrf": _csrf(page), "tenant": "red"}
        assert browser.post("/ui/schedules/nightly/resume", data=forged).status_code == 404
    assert _schedule_enabled(conveyor_service, "red") is False


def _schedule_enabled(service: Conveyor, tenant: str) -> bool:
    with service.db.transaction() as store:
        found = store.schedule(store.tenant_id(tenant), "nightly")
    assert found is not None
    return found.enabled


def _row(page: httpx.Response, approval: uuid.UUID) -> str:
    """The list's row of that approval (its Approve and Reject form inside)."""
    found = re.search(rf'<tr data-approval="{approval}">.*?</tr>', page.text, re.S)
    assert found is not None, f"approval {approval} is not listed"
    return found.group(0)


def test_an_operator_filters_approvals_by_tenant_and_decides_from_the_list(
    api_url: str, make_key: MakeKey, operator_key: str, conveyor_service: Conveyor
) -> None:
    # Given an export waiting for approval in each of red and blue
    for tenant in ("red", "blue"):
        make_key(tenant)
    red_run, red = _waiting_export(conveyor_service, "red")
    _, blue = _waiting_export(conveyor_service, "blue")
    with _signed_in(api_url, operator_key) as browser:
        # When the operator lists blue's only, then every tenant's, and rejects red's there
        only_blue = browser.get("/ui/approvals", params={"tenant": "blue"})
        nobody = browser.get("/ui/approvals", params={"tenant": "nobody"})
        listed = browser.get("/ui/approvals")
        form = {"csrf": _csrf(listed), "from": "list", "tenant": "red", "comment": " no "}
        made = _decide(browser, red, "reject", **form)
        after = browser.get(made.headers["location"])
    # Then the filter shows one tenant's (a name no tenant has: none), the whole list both
    assert 'id="tenant-filter"' in only_blue.text
    assert f'data-approval="{blue}"' in only_blue.text
    assert f'data-approval="{red}"' not in only_blue.text
    assert "No approval waits" in nobody.text
    assert f'action="/ui/approvals/{red}/approve"' in _row(listed, red)
    assert f'formaction="/ui/approvals/{blue}/reject"' in _row(listed, blue)
    # and the rejection went back to the list, its filter kept, as the API records one
    assert made.status_code == 303
    assert made.headers["location"].startswith("/ui/approvals?tenant=red&note=Rejected")
    assert f'data-approval="{red}"' not in after.text and 'id="note"' in after.text
    assert wait_for(conveyor_service, red_run).status is ExecutionStatus.COMPLETED
    output = node_output(conveyor_service, red_run, "approve")
    decided = (output["decision"], output["by"], output["comment"])
    assert decided == ("rejected", "key:operator", "no")
    assert [p.id for p in conveyor_service.approvals("blue")] == [blue]


def test_a_tenants_list_ignores_the_tenant_filter_and_its_list_decisions_keep_the_checks(
    api_url: str, make_key: MakeKey, conveyor_service: Conveyor
) -> None:
    # Given an export waiting for approval in each of acme and globex
    acme_key = make_key("acme")
    make_key("globex")
    acme_run, acme = _waiting_export(conveyor_service, "acme")
    _, globex = _waiting_export(conveyor_service, "globex")
    with _signed_in(api_url, acme_key) as browser:
        # When acme's session asks for globex's approvals
        asked = browser.get("/ui/approvals", params={"tenant": "globex"})
        token = _csrf(asked)
        # and posts list decisions: on globex's, without a token, then its own
        forged = _decide(browser, globex, "approve", csrf=token, **{"from": "list"})
        tokenless = _decide(browser, acme, "approve", **{"from": "list"})
        made = _decide(browser, acme, "approve", csrf=token, tenant="globex",
                       **{"from": "list"})  # fmt: skip
    # Then its own list shows, with no filter and no tenant column
    assert 'id="tenant-filter"' not in asked.text and '<td class="tenant">' not in asked.text
    assert f'data-approval="{acme}"' in asked.text
    assert f'data-approval="{globex}"' not in asked.text
    # and globex's is refused as unknown, the token-less one as stale; nothing decided by them
    assert forged.status_code == 404 and "globex" not in forged.text
    assert tokenless.status_code == 403
    assert [p.id for p in conveyor_service.approvals("globex")] == [globex]
    # and its own decision is recorded under its key, back to its own list (no filter)
    assert made.status_code == 303
    assert made.headers["location"].startswith("/ui/approvals?note=Approved")
    assert wait_for(conveyor_service, acme_run).status is ExecutionStatus.COMPLETED
    assert node_output(conveyor_service, acme_run, "approve")["by"] == "key:test"
