"""OpenTelemetry traces end to end: real PostgreSQL, Redis broker and the in-process worker,
its spans taken by the SDK's in-memory exporter."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, Sampler
from opentelemetry.trace import StatusCode, TraceFlags
from sqlalchemy import select
from sqlalchemy.orm import Session
from standardwebhooks import Webhook

import conveyor
from conveyor import tracing
from conveyor.engine import triggering
from conveyor.engine.credentials import new_webhook_secret
from conveyor.engine.cron import parse_cron
from conveyor.engine.definitions import ScheduleSpec
from conveyor.engine.states import ExecutionStatus, SignatureScheme, TriggerSource
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution
from conveyor.scheduler import schedules
from conveyor.service import Conveyor
from conveyor.service.base import utcnow
from tests.support.outbound import http_allowed
from tests.support.services import wait_for

_provider: TracerProvider | None = None  # the test's, which a node's own spans use


@conveyor.node("test.traced")
def traced(value: int, ctx: conveyor.NodeContext) -> dict[str, Any]:
    """What the node's code sees as the current span, and a span of its own."""
    seen = trace.get_current_span().get_span_context()
    assert _provider is not None
    with _provider.get_tracer("user-code").start_as_current_span("user work"):
        pass
    return {"value": value, "span_id": format(seen.span_id, "016x")}


@conveyor.node("test.fails_once")
def fails_once(value: int, ctx: conveyor.NodeContext) -> dict[str, int]:
    if ctx.attempt == 1:
        raise RuntimeError("the first try fails")
    return {"value": value}


@contextmanager
def recorded(sampler: Sampler | None = None) -> Iterator[InMemorySpanExporter]:
    """Conveyor's spans (and the nodes' own) taken in memory, as each ends."""
    global _provider
    exporter = InMemorySpanExporter()
    _provider = TracerProvider(sampler=sampler)
    _provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(_provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        _provider.shutdown()
        _provider = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recorded() as exporter:
        yield exporter


def apply(service: Conveyor, name: str, nodes: list[dict[str, Any]]) -> None:
    service.apply(parse_workflow({"name": name, "nodes": nodes}))


def py(node_id: str, function: str, *needs: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": node_id,
        "type": "python",
        "config": {"function": f"test.{function}"},
        "needs": list(needs),
        "inputs": {"value": 1},
        **extra,
    }


def ended(exporter: InMemorySpanExporter, count: int, prefix: str) -> list[ReadableSpan]:
    """The ended spans whose name starts with ``prefix``, once there are ``count`` (a try's
    span ends after its outcome is committed, which may be after the execution finished)."""
    deadline = time.monotonic() + 10
    while True:
        found = [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_one_trace_runs_from_the_trigger_to_every_try_of_a_diamond(
    conveyor_service: Conveyor, spans: InMemorySpanExporter
) -> None:
    # Given a diamond whose left branch fails its first try and is retried
    retry = {"max_attempts": 3, "backoff": 0.05, "jitter": 0}
    apply(
        conveyor_service,
        "traced-diamond",
        [
            py("start", "traced"),
            py("left", "fails_once", "start", retry=retry),
            py("right", "traced", "start"),
            py("join", "traced", "left", "right"),
        ],
    )

    # When it is triggered and runs to the end
    execution_id = conveyor_service.trigger("traced-diamond", {})
    row = wait_for(conveyor_service, execution_id)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    tries = ended(spans, 5, "conveyor.node ")
    (trigger,) = ended(spans, 1, "conveyor.trigger ")

    # Then the trigger span and every try span are one trace, each try the trigger's child
    assert trigger.name == "conveyor.trigger traced-diamond"
    assert attributes(trigger)["conveyor.execution_id"] == str(execution_id)
    assert attributes(trigger)["conveyor.trigger"] == "api"
    assert len(tries) == 5
    assert {s.context.trace_id for s in tries} == {trigger.context.trace_id}
    assert all(s.parent is not None and s.parent.span_id == trigger.context.span_id for s in tries)
    by_node: dict[str, list[ReadableSpan]] = {}
    for span in sorted(tries, key=lambda s: s.start_time or 0):
        by_node.setdefault(attributes(span)["conveyor.node"], []).append(span)
    assert set(by_node) == {"start", "left", "right", "join"}
    for node_id, found in by_node.items():
        for span in found:
            assert span.name == f"conveyor.node traced-diamond/{node_id}"
            assert attributes(span)["conveyor.workflow"] == "traced-diamond"
            assert attributes(span)["conveyor.execution_id"] == str(execution_id)
            uuid.UUID(attributes(span)["conveyor.job_id"])
    # And the retried node shows both tries with their outcomes, the failed one as an error
    first, second = by_node["left"]
    assert [attributes(s)["conveyor.attempt"] for s in (first, second)] == [1, 2]
    assert attributes(first)["conveyor.outcome"] == "retry"
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert "the first try fails" in str((first.events[0].attributes or {})["exception.message"])
    assert attributes(second)["conveyor.outcome"] == "completed"
    assert second.status.status_code is StatusCode.UNSET
    assert all(attributes(s)["conveyor.outcome"] == "completed" for s in by_node["join"])
    # And a python node's code ran with its try's span current: its own spans joined it
    (join,) = by_node["join"]
    assert row.output == {"join": {"value": 1, "span_id": format(join.context.span_id, "016x")}}
    mine = [s for s in spans.get_finished_spans() if s.name == "user work"]
    assert {s.parent.span_id for s in mine if s.parent} == {
        by_node[n][0].context.span_id for n in ("start", "right", "join")
    }
    assert {s.context.trace_id for s in mine} == {trigger.context.trace_id}


def test_a_trigger_inside_the_callers_span_joins_its_trace(
    conveyor_service: Conveyor, spans: InMemorySpanExporter
) -> None:
    apply(conveyor_service, "traced-one", [py("only", "traced")])
    assert _provider is not None

    # When an application triggers inside a span of its own (its web request, say)
    with _provider.get_tracer("app").start_as_current_span("POST /orders") as request:
        execution_id = conveyor_service.trigger("traced-one", {})
    wait_for(conveyor_service, execution_id)

    # Then the trigger span is its child, and the node's try is in the same trace
    (trigger,) = ended(spans, 1, "conveyor.trigger ")
    (only,) = ended(spans, 1, "conveyor.node ")
    assert (
        trigger.parent is not None and trigger.parent.span_id == request.get_span_context().span_id
    )
    assert only.context.trace_id == request.get_span_context().trace_id
    assert only.parent is not None and only.parent.span_id == trigger.context.span_id


def test_a_large_executions_plan_on_an_execution_worker_is_in_its_trace(
    conveyor_service: Conveyor, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a workflow too large to be planned by its trigger (a limit under its two nodes)
    monkeypatch.setattr(triggering, "INLINE_PLAN_NODES", 1)
    apply(conveyor_service, "traced-large", [py("a", "traced"), py("b", "traced", "a")])

    execution_id = conveyor_service.trigger("traced-large", {})
    wait_for(conveyor_service, execution_id)

    # Then its plan is a span beside its tries, each a child of the trigger span
    (trigger,) = ended(spans, 1, "conveyor.trigger ")
    (plan,) = ended(spans, 1, "conveyor.plan ")
    tries = ended(spans, 2, "conveyor.node ")
    assert plan.name == "conveyor.plan traced-large"
    assert attributes(plan)["conveyor.execution_id"] == str(execution_id)
    assert len(tries) == 2
    for span in (plan, *tries):
        assert span.context.trace_id == trigger.context.trace_id
        assert span.parent is not None and span.parent.span_id == trigger.context.span_id


def test_an_enqueue_in_the_applications_transaction_joins_its_span(
    conveyor_service: Conveyor, spans: InMemorySpanExporter
) -> None:
    apply(conveyor_service, "traced-enqueued", [py("only", "traced")])
    assert _provider is not None

    with (
        _provider.get_tracer("app").start_as_current_span("POST /invoices") as request,
        Session(conveyor_service.db.engine) as session,
        session.begin(),
    ):
        execution_id = conveyor.enqueue(session, "traced-enqueued", {})
    wait_for(conveyor_service, execution_id)

    (trigger,) = ended(spans, 1, "conveyor.trigger ")
    (only,) = ended(spans, 1, "conveyor.node ")
    assert (
        trigger.parent is not None and trigger.parent.span_id == request.get_span_context().span_id
    )
    assert attributes(trigger)["conveyor.execution_id"] == str(execution_id)
    assert only.parent is not None and only.parent.span_id == trigger.context.span_id


def test_an_execution_stored_without_a_trace_context_gets_one_trace_from_its_id(
    conveyor_service: Conveyor, spans: InMemorySpanExporter
) -> None:
    # Given an execution stored with no trace context (triggered where no provider was set),
    # whose only node fails for good
    apply(
        conveyor_service,
        "untraced",
        [py("a", "fails_once", retry={"max_attempts": 1}), py("b", "traced", "a")],
    )
    made = conveyor_service.db.autocommit(
        lambda s: triggering.trigger(
            s, workflow_name="untraced", tenant="default", input={}, now=utcnow(),
            source=TriggerSource.SCHEDULE,
        )
    )  # fmt: skip
    conveyor_service.dispatcher.publish(made.dispatches)

    row = wait_for(conveyor_service, made.execution_id)

    # Then its try's span has the execution's id as trace id, and says it dead-lettered
    assert row.status is ExecutionStatus.FAILED
    (only,) = ended(spans, 1, "conveyor.node ")
    assert only.context.trace_id == made.execution_id.int
    assert only.parent is not None and only.parent.is_remote
    assert attributes(only)["conveyor.outcome"] == "dead_letter"
    assert only.status.status_code is StatusCode.ERROR


def fire_a_schedule(service: Conveyor, workflow: str) -> Execution:
    """Add a yearly schedule of ``workflow``, make its latest slot due, run the cron check
    (as a worker's duty does) and wait for the run it started."""
    yearly, at = "0 0 1 1 *", utcnow()
    spec = ScheduleSpec(name=f"{workflow}-yearly", cron=yearly, input={})
    record = service.db.run(
        lambda s: schedules.add(s, tenant="default", workflow=workflow, spec=spec, now=at)
    )
    slot = parse_cron(yearly, "UTC").latest(at, at - timedelta(days=400), 1)[0]
    service.db.run(lambda s: s.update_schedule(record.id, at, next_run_at=slot))
    assert service.check_schedules() == 1
    with service.db.transaction() as store:
        (execution_id,) = store.session.scalars(
            select(Execution.id).where(Execution.schedule_id == record.id)
        )
    return wait_for(service, execution_id)


def test_a_schedules_fire_is_a_trigger_span_at_the_root_of_its_runs_trace(
    conveyor_service: Conveyor, spans: InMemorySpanExporter
) -> None:
    apply(conveyor_service, "traced-cron", [py("only", "traced")])

    row = fire_a_schedule(conveyor_service, "traced-cron")

    # Then the fire is a trigger span, a trace's root, whose context the run keeps
    assert row.status is ExecutionStatus.COMPLETED, row.error
    (trigger,) = ended(spans, 1, "conveyor.trigger ")
    (only,) = ended(spans, 1, "conveyor.node ")
    assert trigger.name == "conveyor.trigger traced-cron"
    assert trigger.parent is None
    assert attributes(trigger)["conveyor.trigger"] == "schedule"
    assert attributes(trigger)["conveyor.schedule"] == "traced-cron-yearly"
    made = trigger.context
    assert made.trace_flags.sampled
    assert row.traceparent == f"00-{made.trace_id:032x}-{made.span_id:016x}-{made.trace_flags:02x}"
    assert only.context.trace_id == trigger.context.trace_id
    assert only.parent is not None and only.parent.span_id == trigger.context.span_id


def test_a_schedules_run_the_sampler_drops_at_its_fire_makes_no_span(
    conveyor_service: Conveyor,
) -> None:
    # Given OTEL_TRACES_SAMPLER=parentbased_always_off (every try was recorded before)
    apply(conveyor_service, "unsampled-cron", [py("only", "traced")])
    with recorded(ParentBased(ALWAYS_OFF)) as exporter:
        row = fire_a_schedule(conveyor_service, "unsampled-cron")
        assert row.status is ExecutionStatus.COMPLETED, row.error
        time.sleep(0.2)  # (a try's span ends after its outcome is committed: let it)

    # Then nothing is recorded, and the stored context says "not sampled" to every process
    assert exporter.get_finished_spans() == ()
    assert row.traceparent is not None and not int(row.traceparent[-2:], 16) & TraceFlags.SAMPLED


def test_executions_an_event_or_a_webhook_starts_join_the_trace_they_were_sent_in(
    conveyor_service: Conveyor, spans: InMemorySpanExporter
) -> None:
    # Given a workflow started by an event and one by a webhook endpoint's deliveries
    conveyor_service.apply(
        parse_workflow(
            {"name": "on-event", "nodes": [py("only", "traced")], "events": ["order.placed"]}
        )
    )
    secret = new_webhook_secret(SignatureScheme.STANDARD)
    with conveyor_service.db.transaction() as store:
        endpoint = store.add_endpoint(
            store.tenant_id("default"), "hooks", SignatureScheme.STANDARD, secret, utcnow()
        )
    hooked = {
        "name": "on-hook",
        "nodes": [py("only", "traced")],
        "webhooks": [{"endpoint": "hooks"}],
    }
    conveyor_service.apply(parse_workflow(hooked))
    body, at = b'{"type": "paid"}', datetime.now(UTC)
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign("msg_1", at, body.decode()),
    }
    assert _provider is not None
    app = _provider.get_tracer("app")

    # When the application emits the event, and the API receives the delivery, each in a
    # request's span (the delivery's workflow is started later, by the webhook worker)
    with app.start_as_current_span("POST /events") as emitting:
        (by_event,) = conveyor_service.emit("default", "order.placed", {"id": 7})
    with app.start_as_current_span("POST /webhooks") as receiving:
        conveyor_service.receive_webhook(endpoint.id, body, headers)
    wait_for(conveyor_service, by_event)

    # Then each execution's try is in the trace of the request that sent it, under its
    # trigger span
    tries = ended(spans, 2, "conveyor.node ")
    triggers = {s.name: s for s in ended(spans, 2, "conveyor.trigger ")}
    for request, trigger_name, workflow in (
        (emitting, "conveyor.trigger order.placed", "on-event"),
        (receiving, "conveyor.trigger webhook hooks", "on-hook"),
    ):
        trigger = triggers[trigger_name]
        (run,) = [s for s in tries if attributes(s)["conveyor.workflow"] == workflow]
        caller = request.get_span_context()
        assert trigger.parent is not None and trigger.parent.span_id == caller.span_id
        assert run.context.trace_id == caller.trace_id
        assert run.parent is not None and run.parent.span_id == trigger.context.span_id


class _Recorder(BaseHTTPRequestHandler):
    received: list[dict[str, str]] = []

    def do_GET(self) -> None:
        type(self).received.append(dict(self.headers.items()))
        payload = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    """A loopback server that records the headers of each request it receives."""
    _Recorder.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with http_allowed("127.0.0.1"):
        yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_http_node_sends_its_tries_trace_context(
    conveyor_service: Conveyor, spans: InMemorySpanExporter, recorder: str
) -> None:
    apply(
        conveyor_service,
        "traced-http",
        [
            {"id": "plain", "type": "http", "config": {"url": f"{recorder}/plain"}},
            {
                "id": "own",
                "type": "http",
                "config": {"url": f"{recorder}/own", "headers": {"traceparent": "mine"}},
            },
        ],
    )

    # When it is triggered inside a caller's span that carries vendors' tracestate
    caller = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=5, span_id=7, is_remote=True, trace_flags=trace.TraceFlags(1),
            trace_state=trace.TraceState([("vendor", "caller-secret")]),
        )
    )  # fmt: skip
    with trace.use_span(caller):
        execution_id = conveyor_service.trigger("traced-http", {})
    row = wait_for(conveyor_service, execution_id)

    assert row.status is ExecutionStatus.COMPLETED, row.error
    tries = {attributes(s)["conveyor.node"]: s for s in ended(spans, 2, "conveyor.node ")}
    plain = tries["plain"].context
    sent = {h["traceparent"] for h in _Recorder.received}
    # The called service's spans would be children of the try that called it; a node that
    # sets the header itself keeps its own.
    assert sent == {
        f"00-{plain.trace_id:032x}-{plain.span_id:016x}-{plain.trace_flags:02x}",
        "mine",
    }
    # And the caller's tracestate (stored, and the tries' too) is not sent to the service
    assert row.tracestate == "vendor=caller-secret"
    assert tries["plain"].context.trace_state == trace.TraceState([("vendor", "caller-secret")])
    assert [h for h in _Recorder.received if "tracestate" in {k.lower() for k in h}] == []
