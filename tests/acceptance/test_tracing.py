"""Traces across processes: triggered here, run by a real ``celery worker`` (prefork) that
exports its spans over OTLP/HTTP (CONVEYOR_TRACING=otlp) to a collector on loopback."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conveyor import tracing
from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.support.services import wait_for


class _Loopback(BaseHTTPRequestHandler):
    """The service the http node calls (its traceparent kept) and an OTLP collector (the
    spans it receives kept, decoded)."""

    traceparents: list[str] = []
    spans: list[Any] = []

    def do_GET(self) -> None:
        type(self).traceparents.append(self.headers.get("traceparent", ""))
        self.send_response(204)
        self.end_headers()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    type(self).spans.extend(scope.spans)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def loopback() -> Iterator[str]:
    _Loopback.traceparents, _Loopback.spans = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Loopback)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_worker_process_continues_the_trace_its_execution_was_triggered_in(
    client: Conveyor, start_worker: Callable[..., Popen[str]], loopback: str, tmp_path: Path
) -> None:
    # Given a prefork worker exporting over OTLP, and this process tracing in memory
    worker = start_worker(
        "workflow-node",
        concurrency=2,
        name="traced",
        env={
            "CONVEYOR_TRACING": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": loopback,
            # nothing is exported before the worker stops: its pool processes flush at exit
            "OTEL_BSP_SCHEDULE_DELAY": "600000",
            "CONVEYOR_HTTP_ALLOW": "127.0.0.1",
        },
    )
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    client.apply(
        parse_workflow(
            {
                "name": "accept-traced",
                "nodes": [
                    {"id": "call", "type": "http", "config": {"url": f"{loopback}/hook"}},
                    {"id": "look", "type": "python", "needs": ["call"],
                     "config": {"function": "test.current_span"}},
                ],
            }
        )
    )  # fmt: skip

    # When it is triggered here, inside an application's span
    tracing.use(provider)
    try:
        with provider.get_tracer("app").start_as_current_span("POST /orders") as request:
            execution_id = client.trigger("accept-traced", {})
    finally:
        tracing.use(None)
        provider.shutdown()
    row = wait_for(client, execution_id, timeout=60)

    # Then the worker's tries are in this trace: the http node sent its try's context to the
    # service it called, and the python node's code saw its try's span as the current one
    assert row.status is ExecutionStatus.COMPLETED, row.error
    trace_id = request.get_span_context().trace_id
    (sent,) = _Loopback.traceparents
    assert int(sent.split("-")[1], 16) == trace_id
    assert row.output is not None and int(row.output["look"]["trace_id"], 16) == trace_id
    # And the worker's pool processes exported both tries' spans to the collector as the
    # worker stopped
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=30)
    spans = {span.name: span for span in _Loopback.spans}
    assert set(spans) == {"conveyor.node accept-traced/call", "conveyor.node accept-traced/look"}
    assert {int.from_bytes(s.trace_id, "big") for s in spans.values()} == {trace_id}
    look = spans["conveyor.node accept-traced/look"]
    assert look.span_id.hex() == row.output["look"]["span_id"]
    assert {a.key: a.value.string_value for a in look.attributes if a.value.string_value} == {
        "conveyor.workflow": "accept-traced",
        "conveyor.node": "look",
        "conveyor.execution_id": str(execution_id),
        "conveyor.job_id": look_job(client, execution_id),
        "conveyor.outcome": "completed",
    }
    assert sent.split("-")[2] == spans["conveyor.node accept-traced/call"].span_id.hex()
    # And the try's log lines name its span
    received = [
        json.loads(line)
        for line in (tmp_path / "traced.log").read_text().splitlines()
        if '"job received"' in line and '"node_id": "look"' in line
    ]
    assert [(r["trace_id"], r["span_id"]) for r in received] == [
        (format(trace_id, "032x"), look.span_id.hex())
    ]


def look_job(client: Conveyor, execution_id: Any) -> str:
    with client.db.transaction() as store:
        jobs = {job.node_id: job for job, _ in store.execution_jobs(execution_id)}
    return str(jobs["look"].id)
