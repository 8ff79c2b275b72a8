"""Workflows written in Python: a :class:`Flow` and the nodes its methods place in it, compiled
to exactly the definition the same workflow written in YAML stores.

A node's dependencies are the node objects it names; its inputs may read a parent's output
through the parent's ``out``, typed as the parent's function returns it (a pydantic model, a
TypedDict, a dict), so mypy checks each field read and the editor completes it::

    orders = conveyor.Flow("orders", input=OrderInput)

    @orders.node()
    def fetch(order_id: int) -> Order: ...

    @orders.node(inputs={"total": fetch.out.total})   # {{ nodes.fetch.total }}; needs fetch
    def bill(total: float) -> Receipt: ...

``out`` (and :attr:`Flow.input`, :func:`item_of`) hold a reference, not a value: reading a
field of it makes the Jinja template that reads the field when the node runs. The decorator
registers the function (:func:`conveyor.node`) under ``<flow>.<node id>`` unless ``function``
names another, and the function stays callable as it was. Validation errors name the file and
line that declared the faulty node.
"""

from __future__ import annotations

import functools
import sys
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypedDict, cast

from pydantic import BaseModel
from typing_extensions import TypeVar, Unpack

from conveyor import nodes
from conveyor.engine.addresses import AllowList
from conveyor.engine.bounds import Bounds
from conveyor.engine.definitions import (
    Dedupe,
    Defaults,
    ItemFailure,
    RetryPolicy,
    ScheduleSpec,
    WebhookTrigger,
    Workflow,
)
from conveyor.engine.states import Priority
from conveyor.engine.validation import validate
from conveyor.exceptions import DefinitionError

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
C = TypeVar("C")
In = TypeVar("In", default=Any)
Out = TypeVar("Out", default=Any)


class Ref:
    """A name a template reads when the node runs (``input``, ``nodes.fetch``, ``item``);
    reading an attribute or an item of it reads deeper. Its text is the template."""

    __slots__ = ("_path",)
    _path: tuple[str | int, ...]

    def __init__(self, *path: str | int) -> None:
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Ref:
        if name.startswith("__"):  # copy, pickle and friends probe for these
            raise AttributeError(name)
        return Ref(*self._path, name)

    def __getitem__(self, key: str | int) -> Ref:
        return Ref(*self._path, key)

    @property
    def expression(self) -> str:
        """The Jinja expression: ``nodes.fetch.body``, ``item['a-b']``, ``input.xs[0]``."""
        text = str(self._path[0])
        for part in self._path[1:]:
            text += f".{part}" if isinstance(part, str) and part.isidentifier() else f"[{part!r}]"
        return text

    @property
    def node(self) -> str | None:
        """The node whose output this reads; None for the input or a map's item."""
        return str(self._path[1]) if self._path[0] == "nodes" and len(self._path) > 1 else None

    def __str__(self) -> str:
        return "{{ " + self.expression + " }}"

    def __repr__(self) -> str:
        return f"Ref({self.expression})"


def ref(value: Any) -> Ref:
    """The reference behind a typed ``out``, ``input`` or item (TypeError for a value)."""
    if not isinstance(value, Ref):
        raise TypeError(f"{value!r} is not a reference to a node's output, the input or an item")
    return value


def item_of(over: Sequence[T]) -> T:
    """The item a map's try runs for (``{{ item }}``), typed as an element of ``over``."""
    return cast(T, Ref("item"))


# A map's try's place in its list (``{{ index }}``).
index: int = cast(int, Ref("index"))


@dataclass(frozen=True, kw_only=True)
class Map:
    """A run-time fan-out: the node runs once per item of ``over`` (a reference to a list, or
    a template giving one); see docs/definitions.md."""

    over: Any
    concurrency: int | None = None
    on_item_failure: ItemFailure = ItemFailure.FAIL_FAST
    max_items: int | None = None

    def spec(self) -> dict[str, Any]:
        made = {
            "over": _compiled(self.over),
            "concurrency": self.concurrency,
            "on_item_failure": self.on_item_failure.value,
        }
        return made if self.max_items is None else made | {"max_items": self.max_items}


class NodeOptions(TypedDict, total=False):
    """What every node may set besides its type's own config."""

    after: Sequence[NodeHandle[Any] | Branch]  # its needs, before those its inputs read
    inputs: Mapping[str, Any]  # values, references (``parent.out.field``) or templates
    retry: RetryPolicy
    timeout: float
    continue_on_failure: bool
    max_snoozes: int
    map: Map


class HttpOutput(TypedDict):
    """What an http node gives its successors."""

    status: int
    headers: dict[str, str]
    body: Any


class DelayOutput(TypedDict):
    delayed_seconds: float


class ConditionOutput(TypedDict):
    result: bool
    branch: str


@dataclass(frozen=True, eq=False)
class _Placed:
    """A node as declared: its definition's fields, and the line that declared it."""

    raw: dict[str, Any]
    where: str


class NodeHandle(Generic[R]):
    """A node placed in a flow: name it in another node's ``after``; read its output through
    :attr:`out` (:attr:`outs` for a map)."""

    def __init__(self, flow: Flow[Any, Any], node_id: str) -> None:
        self.flow, self.id = flow, node_id

    @property
    def out(self) -> R:
        """The node's output, read when a successor runs (``{{ nodes.<id> }}``)."""
        self._mapped(False, "its outputs are a list: read them through .outs")
        return cast(R, Ref("nodes", self.id))

    @property
    def outs(self) -> list[R]:
        """A map's outputs, one per item in item order (``{{ nodes.<id> }}``)."""
        self._mapped(True, "it runs once: read its output through .out")
        return cast(list[R], Ref("nodes", self.id))

    def _mapped(self, expected: bool, otherwise: str) -> None:
        """Refuse the read that would render the wrong shape: a map's output is a list."""
        placed = self.flow._nodes.get(self.id)
        if placed is not None and ("map" in placed.raw) is not expected:
            kind = "not a map" if expected else "a map"
            raise DefinitionError([f"{_caller()}: node {self.id!r} is {kind}; {otherwise}"])

    def __repr__(self) -> str:
        return f"<node {self.id!r} of flow {self.flow.name!r}>"


class FlowNode(NodeHandle[R], Generic[P, R]):
    """A python node made by :meth:`Flow.node`: still the function it decorated."""

    def __init__(self, flow: Flow[Any, Any], node_id: str, fn: Callable[P, R]) -> None:
        super().__init__(flow, node_id)
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)


@dataclass(frozen=True)
class Branch:
    """One branch of a condition or a wait; a node whose ``after`` names it runs on that
    branch only."""

    node: NodeHandle[Any]
    key: str  # if_true or if_false; on_event or on_timeout; on_approve or on_reject


class Condition(NodeHandle[ConditionOutput]):
    """A condition node; its successors name :attr:`if_true` or :attr:`if_false`."""

    @property
    def if_true(self) -> Branch:
        return Branch(self, "if_true")

    @property
    def if_false(self) -> Branch:
        return Branch(self, "if_false")


class Wait(NodeHandle[Any]):
    """A wait node (its output the event's payload); its successors may name
    :attr:`on_event` or :attr:`on_timeout`."""

    @property
    def on_event(self) -> Branch:
        return Branch(self, "on_event")

    @property
    def on_timeout(self) -> Branch:
        return Branch(self, "on_timeout")


class Approval(NodeHandle[Any]):
    """An approval node (its output the decision: ``decision``, ``by``, ``at``,
    ``comment``); its successors may name :attr:`on_approve`, :attr:`on_reject` or
    :attr:`on_timeout`."""

    @property
    def on_approve(self) -> Branch:
        return Branch(self, "on_approve")

    @property
    def on_reject(self) -> Branch:
        return Branch(self, "on_reject")

    @property
    def on_timeout(self) -> Branch:
        return Branch(self, "on_timeout")


class Flow(Generic[In, Out]):
    """A workflow declared in Python; :meth:`definition` is what applying it stores.

    ``input`` and ``output`` (a TypedDict or a pydantic model) type :attr:`input`, what
    :meth:`returns` takes, and the result a :class:`conveyor.client.Client` gives back."""

    def __init__(
        self,
        name: str,
        *,
        input: type[In] | None = None,
        output: type[Out] | None = None,
        description: str = "",
        priority: Priority | None = None,
        concurrency: int | None = None,
        defaults: Defaults | None = None,
        schedules: Sequence[ScheduleSpec] = (),
        events: Sequence[str] = (),
        webhooks: Sequence[WebhookTrigger] = (),
        dedupe: Dedupe | None = None,
    ) -> None:
        self.name = name
        self.input_type, self.output_type = input, output
        self._workflow: dict[str, Any] = {
            "name": name,
            "description": description,
            "priority": priority,
            "concurrency": concurrency,
            "defaults": defaults,
            "schedules": list(schedules),
            "events": list(events),
            "webhooks": list(webhooks),
            "dedupe": dedupe,
        }
        self._nodes: dict[str, _Placed] = {}
        self._output: Any = None
        self._where = _caller()

    @property
    def input(self) -> In:
        """The execution's input, read when a node runs (``{{ input }}``)."""
        return cast(In, Ref("input"))

    # Placing nodes.

    def node(
        self, id: str | None = None, *, function: str | None = None, **options: Unpack[NodeOptions]
    ) -> Callable[[Callable[P, R]], FlowNode[P, R]]:
        """Register the decorated function as a python node function (under ``function``,
        default ``<flow>.<id>``) and place it in the flow as the node ``id`` (default: the
        function's name)."""
        where = _caller()

        def place(fn: Callable[P, R]) -> FlowNode[P, R]:
            node_id = id or fn.__name__
            name = function or f"{self.name}.{node_id}"
            nodes.node(name)(_adapted(fn))
            self._place(node_id, "python", {"function": name}, options, where)
            return FlowNode(self, node_id, fn)

        return place

    def call(
        self, fn: Callable[..., R] | str, *, id: str, **options: Unpack[NodeOptions]
    ) -> NodeHandle[R]:
        """Place a python node running a function registered already (by
        :func:`conveyor.node`, :meth:`node` or :func:`conveyor.celery_task`), or named."""
        name = fn if isinstance(fn, str) else _registered_name(fn)
        self._place(id, "python", {"function": name}, options, _caller())
        return NodeHandle(self, id)

    def http(
        self,
        id: str,
        *,
        url: Any,
        method: str | None = None,
        headers: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        body: Any = None,
        **options: Unpack[NodeOptions],
    ) -> NodeHandle[HttpOutput]:
        """Place an http node (see docs/definitions.md for what it sends and refuses)."""
        config = {"url": url, "method": method, "headers": headers, "params": params,
                  "json": json, "body": body}  # fmt: skip
        given = {k: v for k, v in config.items() if v is not None}
        self._place(id, "http", given, options, _caller())
        return NodeHandle(self, id)

    def delay(
        self, id: str, seconds: Any, **options: Unpack[NodeOptions]
    ) -> NodeHandle[DelayOutput]:
        """Place a delay node: held ``seconds`` (a number or a reference) in the database."""
        self._place(id, "delay", {"seconds": seconds}, options, _caller())
        return NodeHandle(self, id)

    def condition(self, id: str, expression: str, **options: Unpack[NodeOptions]) -> Condition:
        """Place a condition node; a successor names its branch: ``after=[check.if_true]``."""
        self._place(id, "condition", {"expression": expression}, options, _caller())
        return Condition(self, id)

    def wait(
        self,
        id: str,
        event: str,
        key: Any,
        *,
        within: Any = None,
        **options: Unpack[NodeOptions],
    ) -> Wait:
        """Place a wait node: it waits, holding no worker, for the application event ``event``
        whose key is ``key`` (a value, a reference or a template), for up to ``within`` (the
        definition's ``timeout``: seconds, or a template giving seconds or a time; the
        ``timeout`` option is the node's, as on every node). A successor names its branch:
        ``after=[paid.on_event]`` or ``after=[paid.on_timeout]``."""
        config: dict[str, Any] = {"event": event, "key": _compiled(key)}
        if within is not None:
            config["timeout"] = _compiled(within)
        self._place(id, "wait", config, options, _caller())
        return Wait(self, id)

    def approval(
        self,
        id: str,
        message: str | None = None,
        *,
        within: Any = None,
        **options: Unpack[NodeOptions],
    ) -> Approval:
        """Place an approval node: it waits, holding no worker, for a person's decision
        (``conveyor approvals approve|reject ID``, or the API), for up to ``within`` (as
        :meth:`wait`'s). ``message`` is what the approver is shown. A successor names its
        branch: ``after=[ok.on_approve]``, ``after=[ok.on_reject]`` (without one, a rejection
        fails the node) or ``after=[ok.on_timeout]``."""
        config: dict[str, Any] = {} if message is None else {"message": message}
        if within is not None:
            config["timeout"] = _compiled(within)
        self._place(id, "approval", config, options, _caller())
        return Approval(self, id)

    def child(
        self,
        id: str,
        workflow: Flow[Any, C] | str,
        *,
        version: int | None = None,
        **options: Unpack[NodeOptions],
    ) -> NodeHandle[C]:
        """Place a workflow node: ``workflow`` runs as a child execution, its inputs the
        child's input and its output the node's (typed as the child flow's output)."""
        name = workflow if isinstance(workflow, str) else workflow.name
        config: dict[str, Any] = {"workflow": name}
        if version is not None:
            config["version"] = version
        self._place(id, "workflow", config, options, _caller())
        return NodeHandle(self, id)

    def add(
        self,
        id: str,
        type: str,
        config: Mapping[str, Any] | None = None,
        **options: Unpack[NodeOptions],
    ) -> NodeHandle[Any]:
        """Place a node of any registered type (:mod:`conveyor.engine.node_types`), its
        config as a definition file writes it: a type that has no method here yet."""
        self._place(id, type, dict(config or {}), options, _caller())
        return NodeHandle(self, id)

    def returns(self, output: Out) -> None:
        """The execution's output: values, references or templates (a TypedDict's or a
        model's fields; ``Model.model_construct(...)`` builds a model of references)."""
        if isinstance(output, BaseModel):
            output = cast(Out, dict(output.__dict__))
        self._output = output

    # The definition.

    def definition(
        self,
        *,
        known_functions: Collection[str] | None = None,
        http_allow: AllowList | None = None,
        bounds: Bounds | None = None,
    ) -> Workflow:
        """The stored definition, validated (given the checks of
        :func:`~conveyor.engine.validation.validate`, as `conveyor workflow apply` gives a
        file); :class:`DefinitionError` lists every problem, a node's at the file and line
        that declared it."""
        raw = self.raw()
        errors = validate(
            raw,
            known_functions=known_functions,
            http_allow=http_allow,
            bounds=bounds,
            parameters=nodes.function_parameters,
        )
        if errors:
            raise DefinitionError([self._located(e) for e in errors], f"flow {self.name!r}")
        return Workflow.model_validate(raw)

    def raw(self) -> dict[str, Any]:
        """The definition as a YAML file would hold it (unvalidated)."""
        fields = {k: v for k, v in self._workflow.items() if v not in (None, [])}
        for key in ("defaults", "dedupe"):
            if key in fields:
                fields[key] = fields[key].model_dump(mode="json")
        fields["schedules"] = [s.model_dump(mode="json") for s in fields.get("schedules", [])]
        fields["webhooks"] = [w.model_dump(mode="json") for w in fields.get("webhooks", [])]
        fields["nodes"] = [placed.raw for placed in self._nodes.values()]
        if self._output is not None:
            fields["output"] = _compiled(self._output)
        return fields

    def _located(self, error: str) -> str:
        for node_id, placed in self._nodes.items():
            if error.startswith(f"node {node_id!r}"):
                return f"{placed.where}: {error}"
        return f"{self._where}: {error}"

    def _place(
        self, node_id: str, kind: str, config: dict[str, Any], options: NodeOptions, where: str
    ) -> None:
        if node_id in self._nodes:
            raise DefinitionError(
                [f"{where}: node {node_id!r} is declared twice (first at "
                 f"{self._nodes[node_id].where}); give the second another id"],
                f"flow {self.name!r}",
            )  # fmt: skip
        inputs = _compiled(dict(options.get("inputs", {})))
        config = _compiled(config)
        needs = self._needs(node_id, options.get("after", ()))
        found = [*needs, *_reads(options.get("inputs", {})), *_reads(config)]
        if (spread := options.get("map")) is not None:
            found += _reads(spread.over)
        needs = [n for n in dict.fromkeys(found) if n != node_id]
        raw: dict[str, Any] = {
            "id": node_id,
            "type": kind,
            "config": config,
            "inputs": inputs,
            "needs": needs,
        }
        if spread is not None:
            raw["map"] = spread.spec()
        if (retry := options.get("retry")) is not None:
            raw["retry"] = retry.model_dump(mode="json")
        for key in ("timeout", "continue_on_failure", "max_snoozes"):
            if key in options:
                raw[key] = options[key]
        self._nodes[node_id] = _Placed(raw=raw, where=where)

    def _needs(self, node_id: str, after: Sequence[NodeHandle[Any] | Branch]) -> list[str]:
        needs = []
        for parent in after:
            handle = parent.node if isinstance(parent, Branch) else parent
            if handle.flow is not self:
                raise DefinitionError(
                    [f"{_caller()}: node {node_id!r} names {handle!r} in after; a node needs "
                     f"nodes of its own flow: run another flow with flow.child(...)"]
                )  # fmt: skip
            if isinstance(parent, Branch):
                config = self._nodes[handle.id].raw["config"]
                config.setdefault(parent.key, []).append(node_id)
            needs.append(handle.id)
        return needs


def _compiled(value: Any) -> Any:
    """``value`` with each reference made its template, as a definition file would hold it."""
    if isinstance(value, Ref):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _compiled(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_compiled(v) for v in value]
    return value


def _reads(value: Any) -> list[str]:
    """The nodes whose outputs the references inside ``value`` read, in order."""
    if isinstance(value, Ref):
        return [value.node] if value.node is not None else []
    if isinstance(value, Mapping):
        return [n for v in value.values() for n in _reads(v)]
    if isinstance(value, list | tuple):
        return [n for v in value for n in _reads(v)]
    return []


def _caller() -> str:
    """``file:line`` of the first frame outside this module: where the node was declared."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _registered_name(fn: Callable[..., Any]) -> str:
    target = fn.fn if isinstance(fn, FlowNode) else fn
    name = nodes.registered_name(target)
    if name is None:
        raise DefinitionError(
            [f"{getattr(fn, '__qualname__', fn)!r} is not a registered node function; "
             f"decorate it with @conveyor.node(NAME) or place it with @flow.node()"]
        )  # fmt: skip
    return name


def _adapted(fn: Callable[P, R]) -> Callable[..., Any]:
    """``fn`` as a node function: a pydantic model it returns is stored as its JSON dump, and
    a parameter annotated with a model receives one built from the input's mapping."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        for name, model in _model_parameters(fn).items():
            if isinstance(kwargs.get(name), Mapping):
                kwargs[name] = model.model_validate(kwargs[name])
        result = fn(*args, **kwargs)
        return result.model_dump(mode="json") if isinstance(result, BaseModel) else result

    return run


@functools.lru_cache(maxsize=1024)
def _model_parameters(fn: Callable[..., Any]) -> dict[str, type[BaseModel]]:
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):  # a name the module no longer holds: take values as given
        return {}
    return {
        name: hint
        for name, hint in hints.items()
        if name != "return" and isinstance(hint, type) and issubclass(hint, BaseModel)
    }


def flows_in(module: object) -> list[Flow[Any, Any]]:
    """The flows a module declares at its top level, in the order it declares them."""
    return [value for value in vars(module).values() if isinstance(value, Flow)]
