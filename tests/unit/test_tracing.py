"""conveyor.tracing without a tracer provider (the default), with the SDK's in memory, and its
settings."""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, Sampler, TraceIdRatioBased
from pydantic import ValidationError

from conveyor import logs, tracing
from conveyor.config import Settings
from conveyor.engine.records import TraceContext
from conveyor.exceptions import ConfigurationError
from conveyor.ids import new_id

STORED = TraceContext(
    traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", tracestate="k=v"
)


def a_run(stored: TraceContext | None) -> Any:
    execution = SimpleNamespace(id=new_id(), trace=stored)
    return SimpleNamespace(
        execution=execution, workflow=SimpleNamespace(name="wf"),
        node=SimpleNamespace(id="n"), job=SimpleNamespace(id=new_id()), attempt=1,
    )  # fmt: skip


def test_without_a_provider_a_try_makes_its_stored_context_current_for_the_node() -> None:
    with tracing.node_try(a_run(STORED), 0):
        current = trace.get_current_span().get_span_context()
        passed_on = tracing.current_context()

    assert current.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert current.span_id == 0xB7AD6B7169203331
    assert passed_on == STORED  # what the http node sends on
    assert not trace.get_current_span().get_span_context().is_valid  # and no more after


def test_without_a_provider_a_try_of_an_execution_without_a_context_does_nothing() -> None:
    with tracing.node_try(a_run(None), 0):
        assert tracing.current_context() is None


def test_without_a_provider_a_trigger_stores_no_context_unless_the_caller_has_one() -> None:
    with tracing.trigger_span("wf", "api") as stored:
        assert stored is None
    caller = trace.NonRecordingSpan(
        trace.SpanContext(trace_id=5, span_id=7, is_remote=True, trace_flags=trace.TraceFlags(1))
    )
    with trace.use_span(caller), tracing.trigger_span("wf", "api") as stored:
        assert stored == TraceContext(traceparent=f"00-{5:032x}-{7:016x}-01")


def test_an_unknown_exporter_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="none, console, otlp"):
        tracing.configure("jaeger")
    with pytest.raises(ValidationError, match=re.escape("(none|console|otlp)")):
        Settings(tracing="jaeger")


def test_the_otlp_exporter_without_its_package_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (a None entry in sys.modules makes its import fail, as when it is not installed)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ConfigurationError, match=r"conveyor\[otlp\]"):
        tracing.configure("otlp")


def test_none_installs_no_provider() -> None:
    tracing.configure("none")
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_a_tracestate_too_long_to_store_loses_whole_members_from_its_end() -> None:
    first, second, third = "a=" + "1" * 250, "b=" + "2" * 200, "c=" + "3" * 100
    assert tracing.bounded(f"{first},{second}") == f"{first},{second}"  # 455: kept
    assert tracing.bounded(f"{first}, {second} ,{third}") == f"{first},{second}"  # 557: cut
    assert tracing.bounded(f"{third},{'d=' + '4' * 600}") == third
    assert tracing.bounded("x=" + "9" * 600) is None  # a single member too long: none
    assert tracing.bounded("") is None
    assert len(tracing.bounded(",".join(f"k{i}=" + "v" * 60 for i in range(32))) or "") <= 512


@contextmanager
def recorded(sampler: Sampler | None = None) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        provider.shutdown()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recorded() as exporter:
        yield exporter


def test_a_failed_trys_exception_leaves_with_its_message_cut_as_the_logs_cut_it(
    spans: InMemorySpanExporter,
) -> None:
    # Given a node whose error carries its data past the logs' bound (and a cause's too)
    card, email, padding = "4111" * 4, "jane" + "@example.com", "x" * 400

    def fails() -> None:
        raise ValueError(f"card rejected: {padding} number={card}")

    with tracing.node_try(a_run(STORED), 0):
        try:
            try:
                raise KeyError(f"customer={email}")
            except KeyError:
                fails()
        except ValueError as exc:
            tracing.outcome("dead_letter", exc)

    # Then the exception event has the cut message, and nothing past it anywhere
    ((event,),) = [span.events for span in spans.get_finished_spans()]
    found = dict(event.attributes or {})
    assert event.name == "exception"
    assert found["exception.type"] == "ValueError"
    assert found["exception.message"] == logs.short(f"card rejected: {padding}")
    assert len(str(found["exception.message"])) == logs.ERROR_CHARS
    assert "in fails" in str(found["exception.stacktrace"])  # its frames are there
    assert str(found["exception.stacktrace"]).endswith(f"ValueError: {found['exception.message']}")
    for value in found.values():
        assert card not in str(value) and email not in str(value)


def test_an_execution_without_a_context_is_traced_only_if_the_sampler_would_root_it() -> None:
    # Given OTEL_TRACES_SAMPLER=parentbased_always_off (the parent was forced sampled before)
    with recorded(ParentBased(ALWAYS_OFF)) as exporter:
        run = a_run(None)
        with tracing.node_try(run, 0):
            pass
        with tracing.plan_span(run.execution, "wf", 0):
            pass

    assert exporter.get_finished_spans() == ()


def test_a_ratio_sampler_decides_once_for_every_try_of_an_execution_without_a_context() -> None:
    # Given parentbased_traceidratio at one half, and 200 executions of two tries each
    with recorded(ParentBased(TraceIdRatioBased(0.5))) as exporter:
        runs = [a_run(None) for _ in range(200)]
        for run in runs * 2:
            with tracing.node_try(run, 0):
                pass

    # Then about half the executions are traced (each a trace of its id), with both tries
    traced = Counter(span.context.trace_id for span in exporter.get_finished_spans())
    assert set(traced.values()) == {2}
    assert set(traced) <= {run.execution.id.int for run in runs}
    assert 60 <= len(traced) <= 140  # some 1e-8 chance to fall outside, for a fair coin


@pytest.mark.parametrize("where", ["try", "trigger"])
def test_an_exception_escaping_a_span_is_recorded_cut_too(
    spans: InMemorySpanExporter, where: str
) -> None:
    # Given a try whose outcome could not be recorded, or a trigger that failed (a database
    # error carries the statement's parameters)
    secret = "jane" + "@example.com"
    made = (
        tracing.node_try(a_run(STORED), 0) if where == "try" else tracing.trigger_span("w", "api")
    )
    with pytest.raises(RuntimeError), made:
        raise RuntimeError(f"{'z' * 400} parameters: {secret}")

    (span,) = spans.get_finished_spans()
    (event,) = span.events
    found = dict(event.attributes or {})
    assert found["exception.message"] == logs.short("z" * 400)
    assert all(secret not in str(value) for value in found.values())
    assert span.status.description == logs.short(f"RuntimeError: {'z' * 400}")
