"""Approvals (conveyor.engine.approvals): a wait for a person's decision, made by the
approval's id. Approved, the node completes on its on_approve branch; rejected, on its
on_reject branch or it fails; the decision is its output; a second decision is refused; a
tenant neither sees nor decides another's; a timeout takes on_timeout as a wait's does."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta
from typing import Any

import pytest

from conveyor.engine import approvals, waits
from conveyor.engine.records import WaitRecord
from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobStatus
from conveyor.exceptions import AlreadyDecided, ApprovalNotFound, ConveyorError
from tests.support.bench import Bench, node


def export_flow(bench: Bench, tenant: str = "default", **config: Any) -> None:
    """approve (the export) -> export on approval, notify on rejection (when named)."""
    bench.apply(
        "export",
        node("approve", type="approval", config={"message": "Export?", **config}),
        node("export", "approve"),
        node("notify", "approve"),
        tenant=tenant,
    )


def waiting_approval(bench: Bench, tenant: str = "default") -> tuple[uuid.UUID, uuid.UUID]:
    """An execution whose approval waits: (its execution id, the approval's id)."""
    made = bench.trigger("export", {"table": "users"}, tenant=tenant)
    run = bench.claim_node(made.execution_id, "approve")
    began = bench.units.run(lambda s: waits.begin_wait(s, run, bench.clock(), random.Random(7)))
    assert began.waiting
    return made.execution_id, run.job.id


def decide(
    bench: Bench, approval_id: uuid.UUID, approved: bool, *, tenant: str = "default",
    by: str = "ada", comment: str | None = None,
) -> approvals.Decided:  # fmt: skip
    decision = approvals.Decision(approved=approved, by=by, at=bench.clock(), comment=comment)
    return bench.units.run(
        lambda s: approvals.decide(s, s.tenant_id(tenant), approval_id, decision)
    )


def pending(bench: Bench, tenant: str = "default") -> list[WaitRecord]:
    return bench.units.run(lambda s: s.pending_waits(s.tenant_id(tenant), waits.APPROVAL_EVENT))


def test_an_approval_waits_until_approved_then_runs_its_on_approve_branch_with_the_decision(
    bench: Bench,
) -> None:
    export_flow(bench, on_approve=["export"], on_reject=["notify"])
    execution_id, approval_id = waiting_approval(bench)

    assert [w.job_id for w in pending(bench)] == [approval_id]
    assert bench.job(execution_id, "approve").status is JobStatus.WAITING_EVENT

    bench.clock.advance(30)
    decided = decide(bench, approval_id, True, comment="fine")

    assert decided.execution_id == execution_id
    assert [d.job_id for d in decided.after.dispatches] == [bench.job(execution_id, "export").id]
    assert bench.statuses(execution_id) == {
        "approve": "completed", "export": "queued", "notify": "skipped",
    }  # fmt: skip
    output = bench.probe.nodes(execution_id)["approve"].output
    assert output == {
        "decision": "approved", "by": "ada", "at": bench.clock().isoformat(), "comment": "fine",
    }  # fmt: skip
    assert pending(bench) == []


def test_a_rejection_runs_the_on_reject_branch(bench: Bench) -> None:
    export_flow(bench, on_approve=["export"], on_reject=["notify"])
    execution_id, approval_id = waiting_approval(bench)

    decide(bench, approval_id, False, by="grace", comment="not today")

    assert bench.statuses(execution_id) == {
        "approve": "completed", "export": "skipped", "notify": "queued",
    }  # fmt: skip
    output = bench.probe.nodes(execution_id)["approve"].output
    assert (output["decision"], output["by"], output["comment"]) == (
        "rejected", "grace", "not today",
    )  # fmt: skip


def test_a_rejection_without_an_on_reject_branch_fails_the_node_naming_the_fix(
    bench: Bench,
) -> None:
    export_flow(bench)
    execution_id, approval_id = waiting_approval(bench)

    decide(bench, approval_id, False, by="grace", comment="too big")

    assert bench.job(execution_id, "approve").status is JobStatus.DEAD_LETTER
    assert bench.probe.execution(execution_id).status is ExecutionStatus.FAILED
    (attempt,) = bench.probe.attempts(approval_id)
    assert attempt.status is AttemptStatus.FAILED
    assert "rejected by grace (too big)" in (attempt.error or "")
    assert "config.on_reject" in (attempt.error or "")


def test_deciding_twice_is_refused_naming_the_first_decision(bench: Bench) -> None:
    export_flow(bench, on_reject=["notify"])
    execution_id, approval_id = waiting_approval(bench)
    decide(bench, approval_id, True, by="ada")

    with pytest.raises(AlreadyDecided, match="already approved by ada"):
        decide(bench, approval_id, False, by="grace")

    assert bench.probe.nodes(execution_id)["approve"].output["by"] == "ada"
    assert bench.statuses(execution_id)["notify"] == "skipped"


def test_a_tenant_neither_sees_nor_decides_another_tenants_approval(bench: Bench) -> None:
    export_flow(bench)
    export_flow(bench, tenant="other")
    execution_id, approval_id = waiting_approval(bench)

    assert pending(bench, "other") == []
    with pytest.raises(ApprovalNotFound, match="conveyor approvals list"):
        decide(bench, approval_id, True, tenant="other")

    assert bench.statuses(execution_id)["approve"] == "waiting"
    assert [w.job_id for w in pending(bench)] == [approval_id]


def test_an_unknown_approval_is_not_found(bench: Bench) -> None:
    export_flow(bench)

    with pytest.raises(ApprovalNotFound):
        decide(bench, uuid.uuid4(), True)


def test_an_approval_past_its_timeout_takes_its_on_timeout_branch_and_cannot_be_decided(
    bench: Bench,
) -> None:
    bench.apply(
        "export",
        node("approve", type="approval", config={"timeout": 60, "on_timeout": ["notify"]}),
        node("export", "approve"),
        node("notify", "approve"),
    )
    execution_id, approval_id = waiting_approval(bench)

    bench.clock.advance(61)
    settled, _ = bench.units.run(lambda s: waits.expire_waits(s, bench.clock(), 100))

    assert settled == 1
    assert bench.statuses(execution_id) == {
        "approve": "completed", "export": "queued", "notify": "queued",
    }  # fmt: skip
    with pytest.raises(ApprovalNotFound):
        decide(bench, approval_id, True)


def test_no_application_event_may_take_the_name_decisions_are_kept_under(bench: Bench) -> None:
    export_flow(bench)
    _, approval_id = waiting_approval(bench)

    def forge(s: Any) -> waits.Sent:
        return waits.send_event(
            s, s.tenant_id("default"), waits.APPROVAL_EVENT, str(approval_id),
            {"decision": "approved"}, bench.clock(), timedelta(days=1),
        )  # fmt: skip

    with pytest.raises(ConveyorError, match="conveyor approvals approve"):
        bench.units.run(forge)
    assert [w.job_id for w in pending(bench)] == [approval_id]


def test_a_decision_must_name_who_made_it(bench: Bench) -> None:
    export_flow(bench)
    _, approval_id = waiting_approval(bench)

    with pytest.raises(ConveyorError, match="who made it"):
        decide(bench, approval_id, True, by=" ")
