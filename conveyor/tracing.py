"""OpenTelemetry traces: one trace per execution, from its trigger to its last node's try.

- Where an execution is triggered (the API, the CLI, :func:`conveyor.enqueue`, an event, a
  webhook delivery received) a ``conveyor.trigger`` span is started as a child of the
  caller's current span, if any (a schedule's fire: a root span, :func:`fire_spans`); its
  W3C trace context is stored with the execution
  (``traceparent``, ``tracestate``; with a delivery until the webhook worker makes its
  executions), so that the trace crosses processes with the execution's row, which the
  node's claim reads anyway: no message header, no extra read.
- An execution planned by an execution worker has a ``conveyor.plan <workflow>`` span there.
- Every try of a node is a ``conveyor.node <workflow>/<node>`` span, a child of that context,
  with the workflow, node, execution, job, attempt and outcome as attributes, and status ERROR
  with the exception when the try failed. It is the current span while the node runs: a
  python node's function sees it (its own spans, or an instrumented HTTP client's, join the
  trace), and the http node sends it as the ``traceparent`` header of its request.
- An execution without a stored context (triggered where no provider was set and the caller
  had no span) still has one trace: its tries' parent is a context made from its id (the
  trace id is the execution id's 128 bits), a parent no span of its own reports, sampled
  only if the provider's sampler would record a root span there (never forced).

Conveyor only ever asks the global tracer provider (the API's no-op one unless something set
one): with ``CONVEYOR_TRACING=none`` (the default) it installs nothing, so an application or
``opentelemetry-instrument`` that set up the SDK decides where spans go; ``console`` or
``otlp`` make this process install the SDK with that exporter (:func:`configure`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import traceback
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.status import Status, StatusCode

from conveyor import logs
from conveyor.engine.records import TRACESTATE_CHARS, ExecutionRecord, Fire, TraceContext
from conveyor.engine.states import TriggerSource
from conveyor.exceptions import ConfigurationError

if TYPE_CHECKING:
    from conveyor.engine.claiming import NodeRun

log = logging.getLogger("conveyor.tracing")

# The exporters CONVEYOR_TRACING may name; "none" installs nothing.
EXPORTERS = ("none", "console", "otlp")

_W3C = TraceContextTextMapPropagator()
_GLOBAL = trace.get_tracer("conveyor")  # a proxy: it follows the provider set later, if any
_tracer = _GLOBAL
_provider: trace.TracerProvider | None = None  # the one given to use(), if any
_LOW_64 = (1 << 64) - 1


def configure(exporter: str) -> None:
    """Install the SDK's tracer provider with ``exporter`` (``console``: JSON on stderr,
    never mixed with a command's output; ``otlp``: OTLP over HTTP to
    ``OTEL_EXPORTER_OTLP_ENDPOINT``, which needs the ``otlp`` extra) as this process's
    global provider; ``none`` installs nothing. The
    resource's ``service.name`` is ``OTEL_SERVICE_NAME``, else ``conveyor``; the batch
    processor and the exporter read their other ``OTEL_*`` variables themselves."""
    if exporter == "none":
        return
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    if exporter == "console":
        made: SpanExporter = ConsoleSpanExporter(out=sys.stderr)
    elif exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found, unused-ignore]
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise ConfigurationError(
                "CONVEYOR_TRACING=otlp needs the OTLP exporter: pip install 'conveyor[otlp]' "
                "(opentelemetry-exporter-otlp-proto-http)"
            ) from exc
        made = OTLPSpanExporter()
    else:
        raise ConfigurationError(
            f"CONVEYOR_TRACING={exporter!r} is not an exporter; use one of {', '.join(EXPORTERS)}"
        )
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        log.warning(
            "a tracer provider is set already (by the application or opentelemetry-instrument): "
            "Conveyor's spans go to it, and CONVEYOR_TRACING=%s is not installed",
            exporter,
        )
        return
    name = os.environ.get("OTEL_SERVICE_NAME") or "conveyor"
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(made))
    trace.set_tracer_provider(provider)


def flush(timeout: float = 5.0) -> None:
    """Export the spans still buffered (a process about to end: a pool process exits without
    running the SDK's exit handler)."""
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)  # the SDK's; the API's has none
    if force_flush is not None:
        force_flush(int(timeout * 1000))


def use(provider: trace.TracerProvider | None) -> None:
    """Send Conveyor's spans to ``provider`` rather than the global one (None: the global
    one again): for an application that keeps its provider to itself, and for tests."""
    global _tracer, _provider
    _tracer = _GLOBAL if provider is None else provider.get_tracer("conveyor")
    _provider = provider


@contextmanager
def trigger_span(what: str, source: str) -> Iterator[TraceContext | None]:
    """A ``conveyor.trigger <what>`` span (``what``: the workflow, the event, the delivery)
    around a trigger from ``source`` (api, cli, event, webhook), current while it runs;
    yields the trace context to store with the executions it makes (None when no span
    records and the caller has none)."""
    if not _on():  # no span to make: the caller's context, if it has one
        yield current_context()
        return
    span = _tracer.start_span(
        f"conveyor.trigger {what}", kind=SpanKind.PRODUCER, attributes={"conveyor.trigger": source}
    )
    with _current(span):
        yield current_context()


@contextmanager
def fire_spans(fires: list[Fire]) -> Iterator[list[Fire]]:
    """A ``conveyor.trigger <workflow>`` span for each schedule's fire (``conveyor.trigger``:
    schedule), open while the cron check stores them; yields the fires with their span's
    context to store with their execution. Each span is a trace's root (a link to the
    check's own span, if any), so that the sampler decides once for the whole run, as it
    does at any other trigger; with no provider to record them the fires are left as they
    are (no context: their tries' parent is made from the execution's id)."""
    if not _on():
        yield fires
        return
    spans = [_fire_span(fire) for fire in fires]
    try:
        yield [
            replace(fire, trace=_stored(trace.set_span_in_context(span)))
            for fire, span in zip(fires, spans, strict=True)
        ]
    finally:
        for span in spans:
            span.end()


def _fire_span(fire: Fire) -> trace.Span:
    checking = trace.get_current_span().get_span_context()
    return _tracer.start_span(
        f"conveyor.trigger {fire.schedule.workflow_name}",
        context=otel_context.Context(),  # a root, whatever span the check runs in
        kind=SpanKind.PRODUCER,
        attributes={
            "conveyor.trigger": TriggerSource.SCHEDULE.value,
            "conveyor.workflow": fire.schedule.workflow_name,
            "conveyor.schedule": fire.schedule.name,
            "conveyor.scheduled_for": fire.slot.isoformat(),
        },
        links=[trace.Link(checking)] if checking.is_valid else None,
    )


def current_context() -> TraceContext | None:
    """The current span's W3C trace context, or None when there is none."""
    return _stored(otel_context.get_current())


def _stored(context: otel_context.Context) -> TraceContext | None:
    """The W3C trace context of ``context``'s span, as stored, or None when it has none."""
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=context)
    parent = carrier.get("traceparent")
    if parent is None:
        return None
    return TraceContext(traceparent=parent, tracestate=bounded(carrier.get("tracestate") or ""))


def traceparent() -> str | None:
    """The current span's W3C ``traceparent`` alone (what the http node sends), or None."""
    found = current_context()
    return found.traceparent if found is not None else None


def bounded(tracestate: str) -> str | None:
    """``tracestate`` cut to fit its column (:data:`TRACESTATE_CHARS`; OpenTelemetry accepts
    up to 32 members of 256 characters): whole list members dropped from the end, as W3C
    allows a propagator to, never one cut in half; None when nothing is left."""
    members = [m.strip() for m in tracestate.split(",") if m.strip()]
    while members and len(",".join(members)) > TRACESTATE_CHARS:
        members.pop()
    return ",".join(members) or None


def log_fields() -> dict[str, str]:
    """``trace_id`` and ``span_id`` of the current span for a log line (none without one), so
    that a try's log lines and its span find each other."""
    found = trace.get_current_span().get_span_context()
    if not found.is_valid:
        return {}
    return {"trace_id": format(found.trace_id, "032x"), "span_id": format(found.span_id, "016x")}


def annotate(**attributes: str | int | bool) -> None:
    """Attributes on the current span (``conveyor.`` prefixed)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({f"conveyor.{k}": v for k, v in attributes.items()})


@contextmanager
def node_try(run: NodeRun, started_ns: int) -> Iterator[None]:
    """The span of one try (from ``started_ns``, before its claim), current while the node
    runs and its outcome is recorded; a child of the execution's trace context. With no
    provider to record it, the stored context alone is made current (an http node still
    passes it on), and nothing at all is done for an execution that has none."""
    execution = run.execution
    if not _on():
        if execution.trace is None:
            yield
            return
        token = otel_context.attach(_parent(execution.id, execution.trace))
        try:
            yield
        finally:
            otel_context.detach(token)
        return
    name = f"{run.workflow.name}/{run.node.id}"
    span = _tracer.start_span(
        f"conveyor.node {name}",
        context=_parent(execution.id, execution.trace),
        kind=SpanKind.CONSUMER,
        start_time=started_ns,
        attributes={
            "conveyor.workflow": run.workflow.name,
            "conveyor.node": run.node.id,
            "conveyor.execution_id": str(execution.id),
            "conveyor.job_id": str(run.job.id),
            "conveyor.attempt": run.attempt,
        },
    )
    # A failed try's exception is recorded by outcome(); one that escapes here is not the
    # node's (recording its outcome failed): _current records it, and the span has no outcome.
    with _current(span):
        yield


@contextmanager
def plan_span(execution: ExecutionRecord, workflow: str, started_ns: int) -> Iterator[None]:
    """The span of an execution's plan by an execution worker (from ``started_ns``, before
    its claim, to the publish of its root jobs), in the execution's trace."""
    if not _on():
        yield
        return
    span = _tracer.start_span(
        f"conveyor.plan {workflow}",
        context=_parent(execution.id, execution.trace),
        kind=SpanKind.CONSUMER,
        start_time=started_ns,
        attributes={"conveyor.workflow": workflow, "conveyor.execution_id": str(execution.id)},
    )
    with _current(span):
        yield


@contextmanager
def _current(span: trace.Span) -> Iterator[None]:
    """``span`` current until it ends, an exception escaping it recorded as outcome() records
    one (use_span's record_exception would export its message in full)."""
    with trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        try:
            yield
        except Exception as exc:
            _failed(span, exc)
            raise


def _on() -> bool:
    """Whether spans can go anywhere: a provider was given (:func:`use`) or set globally.
    Checked at every span, so that a provider the application sets later is followed; it
    costs a global's read and an environment lookup."""
    return _tracer is not _GLOBAL or not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider
    )


def outcome(name: str, error: BaseException | None = None) -> None:
    """The current try's outcome (completed, retry, dead_letter, cancelled, reclaimed), and
    status ERROR with ``error`` when the try failed."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("conveyor.outcome", name)
    if error is not None:
        _failed(span, error)


def _failed(span: trace.Span, error: BaseException) -> None:
    span.add_event("exception", _exception_attributes(error))
    span.set_status(Status(StatusCode.ERROR, logs.short(f"{type(error).__name__}: {error}")))


def _exception_attributes(error: BaseException) -> dict[str, str]:
    """The ``exception`` event's attributes, its message cut as the logs cut it
    (:func:`conveyor.logs.short`): a node's error may hold its data, which leaves with the
    spans. The stack trace lists the frames and that cut message only (not the chained
    exceptions', where ``record_exception`` would repeat them in full)."""
    kind = type(error)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    message = logs.short(str(error))
    frames = "".join(traceback.format_tb(error.__traceback__))
    return {
        "exception.type": name,
        "exception.message": message,
        "exception.stacktrace": f"Traceback (most recent call last):\n{frames}{name}: {message}",
        "exception.escaped": "False",
    }


def _parent(execution_id: uuid.UUID, stored: TraceContext | None) -> otel_context.Context:
    """The context a try's span is a child of: the stored one, else one made from the
    execution's id (the same for every try of the execution)."""
    if stored is not None:
        carrier = {"traceparent": stored.traceparent}
        if stored.tracestate:
            carrier["tracestate"] = stored.tracestate
        extracted = _W3C.extract(carrier)
        if trace.get_current_span(extracted).get_span_context().is_valid:
            return extracted
    made = SpanContext(
        trace_id=execution_id.int,
        span_id=(execution_id.int & _LOW_64) or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if _samples(execution_id) else 0),
    )
    return trace.set_span_in_context(NonRecordingSpan(made))


def _samples(execution_id: uuid.UUID) -> bool:
    """Whether the provider's sampler records a trace rooted at this execution (asked as for
    a root span, so that every try of the execution gets the same answer under the SDK's
    ParentBased samplers). The trace id asked about is a hash of the id: a UUIDv7's low 64
    bits, which TraceIdRatioBased compares with its ratio, always start with 0b10. A
    provider that is not the SDK's (no ``sampler``) gets an unsampled parent and decides."""
    provider = _provider if _provider is not None else trace.get_tracer_provider()
    sampler = getattr(provider, "sampler", None)
    if sampler is None:
        return False
    spread = int.from_bytes(hashlib.blake2b(execution_id.bytes, digest_size=16).digest(), "big")
    decided = sampler.should_sample(
        otel_context.Context(),
        spread,
        "conveyor.execution",
        attributes={"conveyor.execution_id": str(execution_id)},
    )
    return bool(decided.decision.is_sampled())
