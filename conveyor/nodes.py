"""Running nodes on a worker: the registry of python node functions, and the executors of the
two node types whose tries do I/O (python: a registered function on a node thread; http:
:mod:`conveyor.http_node`), attached here to their types (:mod:`conveyor.engine.node_types`).

A definition can only name functions registered here with :func:`node`; it can never reach an
arbitrary import path. Workers import the modules listed in ``CONVEYOR_IMPORTS`` at start-up,
and those modules register their functions::

    import conveyor

    @conveyor.node("send_invoice")
    def send_invoice(invoice_id: int, ctx: conveyor.NodeContext) -> dict[str, str]:
        ...  # use ctx.idempotency_key for side effects

Inputs arrive as keyword arguments; a parameter named ``ctx`` receives the :class:`NodeContext`.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Protocol, TypeVar

from conveyor import http_node
from conveyor.config import get_settings
from conveyor.engine import bounds, node_types
from conveyor.engine.definitions import Node
from conveyor.engine.node_types import NodeContext as NodeContext  # the service takes it here
from conveyor.engine.node_types import Step
from conveyor.engine.parameters import CONTEXT, Parameters
from conveyor.exceptions import (
    NodeCancelled,
    NodeError,
    NodeTimeout,
    NonRetryableError,
    UnknownFunction,
)


class NodeFunction(Protocol):
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


F = TypeVar("F", bound=Callable[..., Any])
_REGISTRY: dict[str, Callable[..., Any]] = {}
_lock = threading.Lock()


def node(name: str) -> Callable[[F], F]:
    """Register a function as the python node ``name``."""

    def register(fn: F) -> F:
        with _lock:
            existing = _REGISTRY.get(name)
            if existing is not None and existing is not fn and _qualname(existing) != _qualname(fn):
                raise ValueError(
                    f"node function {name!r} is already registered by {_qualname(existing)}; "
                    f"pick another name"
                )
            _REGISTRY[name] = fn
        return fn

    return register


def registered_name(fn: object) -> str | None:
    """The name ``fn`` is registered under (itself, or wrapped by :func:`functools.wraps`:
    a flow's node, a Celery task), or None."""
    for name, found in list(_REGISTRY.items()):
        wrapped = getattr(found, "__wrapped__", None)
        if (
            found is fn
            or wrapped is fn
            or (wrapped is not None and wrapped == getattr(fn, "run", None))
        ):
            return name
    return None


def registered_functions() -> frozenset[str]:
    return frozenset(_REGISTRY)


def function_parameters(name: str) -> Parameters | None:
    """What the function registered under ``name`` takes (validation's
    :class:`~conveyor.engine.parameters.FunctionParameters`); None when none is registered here,
    or its signature cannot be read (a builtin)."""
    fn = _REGISTRY.get(name)
    return None if fn is None else _parameters_of(name, fn)


@lru_cache(maxsize=1024)  # read once per function: a definition may name it 10,000 times
def _parameters_of(name: str, fn: Callable[..., Any]) -> Parameters | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = [p for p in params if p.kind in by_name and p.name != CONTEXT]
    return Parameters(
        function=name,
        shown=", ".join(_shown(p) for p in params),
        named=tuple(p.name for p in named),
        required=frozenset(p.name for p in named if p.default is inspect.Parameter.empty),
        any_keyword=any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
        takes_context=any(p.name == CONTEXT and p.kind in by_name for p in params),
        unreachable=tuple(
            p.name
            for p in params
            if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is inspect.Parameter.empty
        ),
    )


def _shown(parameter: inspect.Parameter) -> str:
    """A parameter without its annotation: ``name``, ``name=default``, ``*args``, ``**kw``."""
    if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
        return f"*{parameter.name}"
    if parameter.kind is inspect.Parameter.VAR_KEYWORD:
        return f"**{parameter.name}"
    if parameter.default is inspect.Parameter.empty:
        return parameter.name
    default = repr(parameter.default)
    return f"{parameter.name}={default if len(default) <= 20 else '…'}"


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def execute(
    node_def: Node,
    context: dict[str, Any],
    ctx: NodeContext,
    timeout: float | None,
    inputs: dict[str, Any] | None = None,
) -> Any:
    """Run one node by its type's executor and return its JSON-serializable output; raise
    NodeError on failure. Its timeout covers rendering its templates too: a render past it is
    a TemplateBudgetExceeded (not retried), never a try left running. ``inputs``: a rerun's,
    taken in place of the node's rendered inputs."""
    step = Step.begin(node_def, context, ctx, timeout, inputs)
    kind = node_types.of(node_def)
    # Validation refuses unknown types; a stored definition may predate a type's removal.
    if kind is None or kind.execute is None:
        raise NonRetryableError(f"node type {node_def.type!r} is not supported by this worker")
    return _ensure_json(kind.execute(step))


def _run_python(step: Step) -> Any:
    """The python node's executor: the function registered under ``config.function``."""
    fn = _REGISTRY.get(step.node.config["function"])
    if fn is None:
        raise UnknownFunction(step.node.config["function"])
    return _call_python(fn, step.inputs, step.ctx, step.timeout, step.started)


# The engine describes these two types; their tries are I/O, which runs here.
node_types.attach("python", _run_python)
node_types.attach("http", http_node.run)


def _ensure_json(value: Any) -> Any:
    """Refuse what the database cannot store or a reader could not read back: non-JSON
    values, NaN/Infinity, NUL characters, an output over CONVEYOR_MAX_OUTPUT_BYTES or nested
    past CONVEYOR_MAX_JSON_DEPTH. The text is made once anyway; its length and brackets are
    the checks' whole cost for most outputs."""
    bound = get_settings().bounds  # made once per process
    try:
        text = json.dumps(value, allow_nan=False)
    except RecursionError as exc:
        raise NonRetryableError(bounds.too_deep("the node's output", bound.json_depth)) from exc
    except (TypeError, ValueError) as exc:
        raise NonRetryableError(
            f"the node returned a value that is not JSON-serializable ({exc}); "
            f"return dicts, lists, strings, finite numbers, booleans or None"
        ) from exc
    if "\\u0000" in text:
        raise NonRetryableError("the node returned a string with a NUL character; remove it")
    # ASCII (json.dumps escapes the rest): its length is its size in bytes.
    if len(text) > bound.output_bytes:
        raise NonRetryableError(
            bounds.too_large(
                "the node's output",
                len(text),
                bound.output_bytes,
                "CONVEYOR_MAX_OUTPUT_BYTES",
                fix="return less (keep large data elsewhere and return a reference to it)",
            )
        )
    if bounds.text_deeper_than(text, value, bound.json_depth):
        raise NonRetryableError(bounds.too_deep("the node's output", bound.json_depth))
    return value


@lru_cache(maxsize=1024)
def _takes_ctx(fn: Callable[..., Any]) -> bool:
    """Whether a registered function asks for the node context (read once per function)."""
    return CONTEXT in inspect.signature(fn).parameters


def _call_python(
    fn: Callable[..., Any],
    inputs: dict[str, Any],
    ctx: NodeContext,
    timeout: float | None,
    started: float,
) -> Any:
    """Call ``fn`` on a node thread; ``timeout`` runs from ``started`` (the node's start:
    its templates' rendering counts)."""
    kwargs = dict(inputs)
    if _takes_ctx(fn):
        kwargs["ctx"] = ctx
    # The function runs on a thread of its own so that a timeout or a cancel frees this
    # worker slot at once; the abandoned thread is told to stop through ctx.cancelled.
    call = _Call(fn, kwargs, f"conveyor-node-{ctx.node_id}")
    thread = _NodeThread.take()
    thread.run(call)
    while not call.done.is_set():
        remaining = None if timeout is None else timeout - (time.monotonic() - started)
        if remaining is not None and remaining <= 0:
            raise _timed_out(thread, call, ctx, timeout or 0.0)
        if ctx.cancel_event.is_set():
            thread.retire()
            raise NodeCancelled(f"node {ctx.node_id!r} was stopped: its execution was cancelled")
        call.done.wait(0.2 if remaining is None else min(0.2, remaining))
    thread.put_back()
    if call.error is not None:
        error = call.error
        if isinstance(error, NodeError):
            raise error
        if isinstance(error, TypeError) and _is_signature_error(fn, kwargs):
            raise NonRetryableError(f"inputs do not match the function: {error}") from error
        raise error
    return call.value


class _Call:
    """One call of a node function, handed to a :class:`_NodeThread`. It runs in the
    caller's context (contextvars): the function sees the try's span as the current one."""

    __slots__ = ("context", "done", "error", "fn", "kwargs", "name", "value")

    def __init__(self, fn: Callable[..., Any], kwargs: dict[str, Any], name: str) -> None:
        self.fn, self.kwargs, self.name = fn, kwargs, name
        self.context = contextvars.copy_context()
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class _NodeThread:
    """A thread that runs node functions one after another, so that a node does not pay for a
    thread's creation and a wait for it to start. A thread whose call was given up on (a
    timeout, a cancel) finishes that call and ends; a new one takes its place."""

    _idle: list[_NodeThread] = []
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="conveyor-node", daemon=True)
        self._thread.start()

    @classmethod
    def take(cls) -> _NodeThread:
        with cls._lock:
            while cls._idle:
                found = cls._idle.pop()
                if found.alive:
                    return found
        return cls()

    def run(self, call: _Call) -> None:
        self._calls.put(call)

    def put_back(self) -> None:
        with self._lock:
            self._idle.append(self)

    def retire(self) -> None:
        """Its call was given up on: the thread ends once that call returns, if ever."""
        self._calls.put(None)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        current = threading.current_thread()
        while (call := self._calls.get()) is not None:
            current.name = call.name
            try:
                call.value = call.context.run(call.fn, **call.kwargs)
            except BaseException as exc:
                call.error = exc
            call.done.set()
            current.name = "conveyor-node"
            del call  # its inputs and output are not kept alive while the thread waits

    @classmethod
    def forget_all(cls) -> None:
        """In a forked child: the parent's threads did not come along (``alive`` says so too),
        and a lock another of its threads held would stay held."""
        cls._idle = []
        cls._lock = threading.Lock()


os.register_at_fork(after_in_child=_NodeThread.forget_all)


def _timed_out(thread: _NodeThread, call: _Call, ctx: NodeContext, timeout: float) -> NodeTimeout:
    """Tell the function to stop and give it a grace period. One that ignores ctx.cancelled
    is not retried: a new try would run beside the abandoned one."""
    ctx.cancel_event.set()
    thread.retire()
    grace = min(5.0, max(1.0, timeout))
    call.done.wait(grace)
    message = f"node {ctx.node_id!r} ran past its timeout of {timeout:g} s"
    if not call.done.is_set():
        return NodeTimeout(
            f"{message} and did not stop within {grace:g} s of being told to (ctx.cancelled); "
            f"not retried, so that two tries never run at once",
            retryable=False,
        )
    return NodeTimeout(message)


def _is_signature_error(fn: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError:
        return True
    return False
