"""The store port's contracts for jobs (Jobs in conveyor.engine.ports), method by method: a
job changes only from the status it expects and, given a try number, only while that try is
its current one."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from opentelemetry import trace

from conveyor import tracing
from conveyor.engine.records import Finish, TraceContext
from conveyor.engine.states import (
    AttemptStatus,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
)
from conveyor.ids import new_id
from tests.support.bench import Bench, node

CHAIN = (node("a"), node("b", "a"))
JOIN = (node("a"), node("b"), node("c", "a", "b"))


def test_claim_node_job_starts_the_try_and_reads_the_outputs_of_its_needs(bench: Bench) -> None:
    # Given a join whose two needs completed
    made = bench.trigger(bench.apply("join", *JOIN).name)
    for need, output in (("a", {"n": 1}), ("b", [2, 3])):
        bench.complete(bench.claim_node(made.execution_id, need), output)
    job = bench.job(made.execution_id, "c")
    bench.clock.advance(2.5)

    claimed = bench.units.autocommit(
        lambda s: s.claim_node_job(job.id, bench.clock(), "w1", ("a", "b"))
    )

    assert claimed is not None
    record_, execution, outputs = claimed
    assert (record_.id, record_.status, record_.try_number) == (job.id, JobStatus.PROCESSING, 1)
    assert (execution.id, execution.status) == (made.execution_id, ExecutionStatus.RUNNING)
    assert outputs == {"a": {"n": 1}, "b": [2, 3]}
    (attempt,) = bench.probe.attempts(job.id)
    assert (attempt.attempt_number, attempt.status, attempt.worker, attempt.waited) == (
        1, AttemptStatus.RUNNING, "w1", 2.5,
    )  # fmt: skip
    assert bench.probe.nodes(made.execution_id)["c"].status is NodeStatus.RUNNING
    assert bench.probe.nodes(made.execution_id)["c"].started_at == bench.clock()


def test_claim_node_job_reads_the_one_need_asked_and_none_unasked(bench: Bench) -> None:
    bench.apply("chain", *CHAIN)
    first, second = bench.trigger("chain"), bench.trigger("chain")
    for made in (first, second):
        bench.complete(bench.claim_node(made.execution_id, "a"), {"n": 1})

    def claim(made: Any, *needs: str) -> Any:
        job_id = bench.job(made.execution_id, "b").id
        return bench.units.autocommit(
            lambda s: s.claim_node_job(job_id, bench.clock(), None, needs)
        )

    assert claim(first)[2] is None
    assert claim(second, "a")[2] == {"a": {"n": 1}}


def test_an_execution_keeps_the_trace_context_it_was_triggered_with_and_its_claims_read_it(
    bench: Bench,
) -> None:
    # Given two runs, one triggered with a W3C trace context (tracestate and all), one without
    bench.apply("chain", *CHAIN)
    trace = TraceContext(
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        tracestate="vendor=opaque,other=1",
    )
    traced, untraced = bench.trigger("chain", trace=trace), bench.trigger("chain")

    def claimed(made: Any) -> Any:
        job_id = bench.job(made.execution_id, "a").id
        return bench.units.autocommit(lambda s: s.claim_node_job(job_id, bench.clock(), None))

    # Then a node's claim reads it with the execution, as does a read of the execution
    assert claimed(traced)[1].trace == trace
    assert claimed(untraced)[1].trace is None
    with bench.store() as store:
        assert store.execution(traced.execution_id).trace == trace
        assert store.execution(untraced.execution_id).trace is None


def test_a_callers_long_tracestate_is_stored_cut_to_whole_members(bench: Bench) -> None:
    # Given a caller's span whose vendors' tracestate is 3 x 250 characters (OpenTelemetry
    # accepts up to 32 members of 256), longer than the 512 the column holds
    members = [(f"vendor{i}", str(i) * 242) for i in range(3)]
    caller = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=5, span_id=7, is_remote=True, trace_flags=trace.TraceFlags(1),
            trace_state=trace.TraceState(members),
        )
    )  # fmt: skip
    with trace.use_span(caller):
        context = tracing.current_context()
    bench.apply("chain", *CHAIN)

    # When an execution is triggered with it (PostgreSQL refused the insert before)
    made = bench.trigger("chain", trace=context)

    # Then it is stored, with the members that fit, the last one dropped
    with bench.store() as store:
        stored = store.execution(made.execution_id).trace
    assert stored is not None and stored.tracestate is not None
    assert stored.tracestate == ",".join(f"{k}={v}" for k, v in members[:2])


def test_a_job_is_claimed_once(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    job = bench.job(made.execution_id, "a")
    assert bench.units.autocommit(lambda s: s.claim_node_job(job.id, bench.clock(), None))
    before = bench.rows(made.execution_id)

    again = bench.units.autocommit(lambda s: s.claim_node_job(job.id, bench.clock(), None))
    unknown = bench.units.autocommit(lambda s: s.claim_node_job(new_id(), bench.clock(), None))

    assert (again, unknown) == (None, None)
    assert bench.rows(made.execution_id) == before


def test_a_job_of_a_finished_execution_is_claimed_but_no_try_starts(bench: Bench) -> None:
    made = bench.trigger(bench.apply("join", *JOIN).name)
    job = bench.job(made.execution_id, "a")
    bench.units.run(
        lambda s: s.finish_execution(made.execution_id, ExecutionStatus.CANCELLED, bench.clock())
    )

    claimed = bench.units.autocommit(
        lambda s: s.claim_node_job(job.id, bench.clock(), "w1", ("b",))
    )

    assert claimed is not None
    assert (claimed[0].status, claimed[1].status, claimed[2]) == (
        JobStatus.PROCESSING, ExecutionStatus.CANCELLED, None,
    )  # fmt: skip
    assert bench.probe.attempts(job.id) == []
    assert bench.probe.nodes(made.execution_id)["a"].status is NodeStatus.QUEUED


def test_claim_job_claims_a_queued_or_parked_job_of_the_kind_asked(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    job = bench.job(made.execution_id, "a")

    assert bench.units.run(lambda s: s.claim_job(job.id, JobKind.EXECUTION, bench.clock())) is None
    assert bench.job(made.execution_id, "a").status is JobStatus.QUEUED
    assert bench.units.run(lambda s: s.transition_job(job.id, JobStatus.QUEUED, JobStatus.PARKED))
    claimed = bench.units.run(lambda s: s.claim_job(job.id, JobKind.NODE, bench.clock()))
    assert claimed is not None and claimed.status is JobStatus.PROCESSING


def test_complete_running_records_a_success_only_for_the_current_try(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    run = bench.claim_node(made.execution_id, "a")
    before = bench.rows(made.execution_id)
    later_try = replace(run.job, retry_count=1)

    def complete(job: Any) -> bool:
        return bench.units.autocommit(lambda s: s.complete_running(
            job, "a", output={"n": 1}, branch=None, now=bench.clock(), duration=0.5))  # fmt: skip

    assert not complete(later_try)
    assert bench.rows(made.execution_id) == before
    assert complete(run.job)
    assert not complete(run.job)  # not processing any more

    job = bench.job(made.execution_id, "a")
    assert (job.status, job.completed_at) == (JobStatus.COMPLETED, bench.clock())
    (attempt,) = bench.probe.attempts(job.id)
    assert (attempt.status, attempt.duration) == (AttemptStatus.SUCCEEDED, 0.5)
    a = bench.probe.nodes(made.execution_id)["a"]
    assert (a.status, a.output) == (NodeStatus.COMPLETED, {"n": 1})
    assert bench.probe.execution(made.execution_id).remaining_nodes == 2  # not settled


def test_complete_running_alone_settles_a_node_that_makes_no_successor_ready(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("join", *JOIN).name)
    a, b = (bench.claim_node(made.execution_id, n) for n in ("a", "b"))

    def alone(run: Any) -> bool:
        return bench.units.autocommit(lambda s: s.complete_running(
            run.job, run.node.id, output={"n": run.node.id}, branch=None, now=bench.clock(),
            duration=0.1, successors=["c"]))  # fmt: skip

    assert alone(a)
    nodes = bench.probe.nodes(made.execution_id)
    assert (nodes["a"].status, nodes["c"].waiting_on) == (NodeStatus.COMPLETED, 1)
    assert bench.probe.execution(made.execution_id).remaining_nodes == 2
    before = bench.rows(made.execution_id)

    assert not alone(b)  # c would be ready: the transaction must enqueue it

    assert bench.rows(made.execution_id) == before


# a fans out to c and d; each of them also waits on a root of its own (x, y)
FORK = (node("a"), node("x"), node("y"), node("c", "a", "x"), node("d", "a", "y"))


def _alone(bench: Bench, run: Any, successors: list[str], job: Any = None) -> bool:
    return bench.units.autocommit(lambda s: s.complete_running(
        job or run.job, run.node.id, output={"n": run.node.id}, branch=None, now=bench.clock(),
        duration=0.1, successors=successors))  # fmt: skip


def test_complete_running_alone_counts_down_every_successor_when_none_becomes_ready(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("fork", *FORK).name)
    a = bench.claim_node(made.execution_id, "a")

    assert _alone(bench, a, ["c", "d"])

    nodes = bench.probe.nodes(made.execution_id)
    assert (nodes["a"].status, nodes["c"].waiting_on, nodes["d"].waiting_on) == (
        NodeStatus.COMPLETED, 1, 1,
    )  # fmt: skip
    assert bench.probe.execution(made.execution_id).remaining_nodes == 4


def test_complete_running_alone_changes_nothing_when_one_of_several_successors_would_be_ready(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("fork", *FORK).name)
    x = bench.claim_node(made.execution_id, "x")
    assert _alone(bench, x, ["c"])  # c now waits on a alone
    a = bench.claim_node(made.execution_id, "a")
    before = bench.rows(made.execution_id)

    assert not _alone(bench, a, ["c", "d"])

    assert bench.rows(made.execution_id) == before


def test_complete_running_alone_changes_nothing_for_a_try_that_is_not_current(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("fork", *FORK).name)
    a = bench.claim_node(made.execution_id, "a")
    before = bench.rows(made.execution_id)

    assert not _alone(bench, a, ["c", "d"], job=replace(a.job, retry_count=1))

    assert bench.rows(made.execution_id) == before


def test_complete_running_alone_changes_nothing_when_a_successor_has_settled(
    bench: Bench,
) -> None:
    # Given c settled already (skipped), though it still counts two needs
    made = bench.trigger(bench.apply("fork", *FORK).name)
    bench.units.run(lambda s: s.set_node(made.execution_id, "c", NodeStatus.SKIPPED))
    a = bench.claim_node(made.execution_id, "a")
    before = bench.rows(made.execution_id)

    assert not _alone(bench, a, ["c", "d"])

    assert bench.rows(made.execution_id) == before


def test_complete_running_alone_completes_the_execution_when_it_settles_the_last_node(
    bench: Bench,
) -> None:
    made = bench.trigger(bench.apply("pair", node("a"), node("b")).name)
    a, b = (bench.claim_node(made.execution_id, n) for n in ("a", "b"))

    def last(run: Any) -> bool:
        return bench.units.autocommit(lambda s: s.complete_running(
            run.job, run.node.id, output=1, branch=None, now=bench.clock(), duration=0.1,
            successors=[], finish=Finish(output={"both": True}, now=bench.clock())))  # fmt: skip

    assert last(a)
    assert bench.probe.execution(made.execution_id).status is ExecutionStatus.RUNNING
    assert last(b)

    done = bench.probe.execution(made.execution_id)
    assert (done.status, done.output, done.remaining_nodes) == (
        ExecutionStatus.COMPLETED, {"both": True}, 0,
    )  # fmt: skip


def test_complete_running_changes_nothing_once_the_execution_finished(bench: Bench) -> None:
    made = bench.trigger(bench.apply("solo", node("a")).name)
    run = bench.claim_node(made.execution_id, "a")
    bench.units.run(
        lambda s: s.finish_execution(made.execution_id, ExecutionStatus.CANCELLED, bench.clock())
    )
    before = bench.rows(made.execution_id)

    assert not bench.units.autocommit(
        lambda s: s.complete_running(
            run.job, "a", output=1, branch=None, now=bench.clock(), duration=0.1, successors=[]
        )
    )
    assert bench.rows(made.execution_id) == before


def test_schedule_retry_moves_only_the_current_try_to_its_wait(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    run = bench.claim_node(made.execution_id, "a")
    due = bench.clock() + timedelta(seconds=30)

    def retry(try_number: int) -> bool:
        return bench.units.run(
            lambda s: s.schedule_retry(run.job.id, due, "boom", try_number=try_number)
        )

    assert not retry(2)
    assert retry(1)
    assert not retry(1)  # waiting now, not processing

    job = bench.job(made.execution_id, "a")
    assert (job.status, job.retry_count, job.next_run_at, job.last_error) == (
        JobStatus.RETRY_WAIT, 1, due, "boom",
    )  # fmt: skip


def test_transition_job_changes_a_job_only_from_the_status_expected(bench: Bench) -> None:
    made = bench.trigger(bench.apply("chain", *CHAIN).name)
    job = bench.job(made.execution_id, "a")

    def transition(expected: JobStatus, try_number: int | None = None) -> bool:
        return bench.units.run(lambda s: s.transition_job(
            job.id, expected, JobStatus.PARKED, try_number=try_number))  # fmt: skip

    assert not transition(JobStatus.PROCESSING)
    assert not transition(JobStatus.QUEUED, try_number=2)
    assert transition(JobStatus.QUEUED, try_number=1)
    assert bench.job(made.execution_id, "a").status is JobStatus.PARKED


def test_promote_due_queues_the_waiting_jobs_whose_time_came_oldest_first(
    bench: Bench,
) -> None:
    # Given three retries waiting 10, 20 and 30 s, and a delay node held for 60 s
    made = bench.trigger(bench.apply(
        "waits", node("a"), node("b"), node("c"), node("d", type="delay", config={"seconds": 60})
    ).name)  # fmt: skip
    for seconds, node_id in ((30, "a"), (10, "b"), (20, "c")):
        run = bench.claim_node(made.execution_id, node_id)
        due = bench.clock() + timedelta(seconds=seconds)
        bench.units.run(lambda s, r=run, d=due: s.schedule_retry(r.job.id, d, "x", try_number=1))
    assert bench.job(made.execution_id, "d").status is JobStatus.SCHEDULED
    bench.clock.advance(25)

    promoted = bench.units.run(lambda s: s.promote_due(bench.clock(), 1))
    rest = bench.units.run(lambda s: s.promote_due(bench.clock(), 10))

    assert [(j.node_id, j.workflow) for j in promoted] == [("b", "waits")]  # its name too
    assert [(j.node_id, j.workflow) for j in rest] == [("c", "waits")]
    jobs = bench.jobs(made.execution_id)
    assert {n: j.status for n, j in jobs.items()} == {
        "a": JobStatus.RETRY_WAIT, "b": JobStatus.QUEUED, "c": JobStatus.QUEUED,
        "d": JobStatus.SCHEDULED,
    }  # fmt: skip
    assert jobs["b"].enqueued_at == bench.clock()
    bench.clock.advance(40)
    assert {j.node_id for j in bench.units.run(lambda s: s.promote_due(bench.clock(), 10))} == {
        "a", "d",
    }  # fmt: skip


def test_age_queued_serves_low_jobs_queued_too_long_as_normal(bench: Bench) -> None:
    bench.apply("pair", node("a"), node("b"))
    old = bench.trigger("pair", priority=Priority.LOW)
    bench.clock.advance(60)
    young = bench.trigger("pair", priority=Priority.LOW)
    high = bench.trigger("pair", priority=Priority.HIGH)
    cutoff = bench.clock() - timedelta(seconds=30)

    aged = bench.units.run(lambda s: s.age_queued(cutoff, 10))

    assert {(j.execution_id, j.node_id) for j in aged} == {
        (old.execution_id, "a"), (old.execution_id, "b"),
    }  # fmt: skip
    assert all(j.priority is Priority.NORMAL and j.workflow == "pair" for j in aged)
    assert {j.priority for j in bench.probe.jobs(young.execution_id)} == {Priority.LOW}
    assert {j.priority for j in bench.probe.jobs(high.execution_id)} == {Priority.HIGH}
    assert bench.units.run(lambda s: s.age_queued(cutoff, 10)) == []
