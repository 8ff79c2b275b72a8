"""Traces across processes: triggered here, run by a real ``celery worker`` (prefork) that
exports its spans with CONVEYOR_TRACING=console."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conveyor import tracing
from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.support.services import wait_for


class _Recorder(BaseHTTPRequestHandler):
    received: list[str] = []

    def do_GET(self) -> None:
        type(self).received.append(self.headers.get("traceparent", ""))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    _Recorder.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_worker_process_continues_the_trace_its_execution_was_triggered_in(
    client: Conveyor,
    start_worker: Callable[..., Popen[str]],
    recorder: str,
    tmp_path: Path,
) -> None:
    # Given a prefork worker exporting to its stdout, and this process tracing in memory
    start_worker(
        "workflow-node",
        concurrency=2,
        name="traced",
        env={
            "CONVEYOR_TRACING": "console",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "CONVEYOR_HTTP_ALLOW": "127.0.0.1",
        },
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client.apply(
        parse_workflow(
            {
                "name": "accept-traced",
                "nodes": [
                    {"id": "call", "type": "http", "config": {"url": f"{recorder}/hook"}},
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
    row = wait_for(client, execution_id, timeout=60)

    # Then the worker's tries are in this trace: the http node sent its try's context to the
    # called service, and the python node's code saw its try's span as the current one
    assert row.status is ExecutionStatus.COMPLETED, row.error
    trace_id = format(request.get_span_context().trace_id, "032x")
    (sent,) = _Recorder.received
    assert sent.split("-")[1] == trace_id
    assert row.output is not None and row.output["look"]["trace_id"] == trace_id
    # And the worker's pool processes exported both tries' spans in that trace
    log = tmp_path / "traced.log"
    deadline = time.monotonic() + 20
    while log.read_text().count(f"0x{trace_id}") < 2:
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    text = log.read_text()
    assert "conveyor.node accept-traced/call" in text
    assert "conveyor.node accept-traced/look" in text
    assert f"0x{row.output['look']['span_id']}" in text  # the span the node saw was exported
    provider.shutdown()
