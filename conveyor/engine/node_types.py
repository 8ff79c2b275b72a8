"""Node types: the kinds of node a definition may name in ``type``, kept in one registry.

A :class:`NodeType` is everything the rest of Conveyor knows of a kind of node: the config keys
it takes and how they are checked, whether its job waits for a time its config gives (a delay),
whether its output chooses the branch its successors run on (a condition), and how one try of
it runs. Validation, planning and the transitions ask the registry (:func:`of`, :func:`named`) and
never compare the name, so a new type joins in one place: one :func:`register` call.

The built-in types are described below, in the order the unknown-type message lists them.
Running a python node (a registered function on a node thread) or an http node (a request) is
I/O, which the engine does not import: the worker attaches those two executors
(:func:`attach`, in :mod:`conveyor.nodes`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, NoReturn, Protocol

from conveyor.engine import bounds, instants, templates
from conveyor.engine.addresses import AllowList, judge_url
from conveyor.engine.definitions import WORKFLOW_NAME, Node
from conveyor.engine.parameters import FunctionParameters, input_problems
from conveyor.engine.template_budget import Deadline
from conveyor.exceptions import NonRetryableError, Snooze


@dataclass(frozen=True, kw_only=True)
class NodeContext:
    """What a running node knows about itself."""

    execution_id: str
    node_id: str
    attempt: int
    # An item of a map (the node's ``map``): its value and its index in the list; None else.
    item: Any = None
    index: int | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event, compare=False)
    # Set when the node read ``cancelled`` as True: it may have stopped early since.
    _told: threading.Event = field(
        default_factory=threading.Event, init=False, compare=False, repr=False
    )

    @property
    def idempotency_key(self) -> str:
        """Stable across retries of this node (of this item of a map) in this execution: key
        side effects with it."""
        if self.index is not None:
            return f"{self.execution_id}:{self.node_id}:{self.index}"
        return f"{self.execution_id}:{self.node_id}"

    @property
    def cancelled(self) -> bool:
        """True once the execution was cancelled or the try timed out: stop soon."""
        if self.cancel_event.is_set():
            self._told.set()
            return True
        return False

    def snooze(self, seconds: float, reason: str | None = None) -> NoReturn:
        """Run this node again in ``seconds`` without spending an attempt (raises
        :class:`~conveyor.exceptions.Snooze`)."""
        raise Snooze(seconds, reason)

    @property
    def told_to_stop(self) -> bool:
        """Whether the node saw ``cancelled`` True: what it returned may be partial."""
        return self._told.is_set()


@dataclass(frozen=True, kw_only=True)
class Step:
    """One try of a node, as its type's executor is handed it. The node's timeout runs from
    ``started`` and covers rendering its templates too."""

    node: Node
    context: Mapping[str, Any]  # the templates' names: input, nodes (its needs'), execution
    inputs: dict[str, Any]  # the node's inputs, rendered
    ctx: NodeContext
    timeout: float | None
    started: float  # time.monotonic() when the try began

    @classmethod
    def begin(
        cls,
        node: Node,
        context: Mapping[str, Any],
        ctx: NodeContext,
        timeout: float | None,
        inputs: dict[str, Any] | None = None,
    ) -> Step:
        """A try that starts now, its inputs rendered within its timeout; ``inputs`` given (a
        rerun's) are taken as they are, in place of the rendered ones."""
        started = time.monotonic()
        deadline = _deadline(started, timeout)
        if inputs is None:
            inputs = templates.render_value(node.inputs, context, deadline=deadline)
        return cls(node=node, context=context, inputs=inputs, ctx=ctx, timeout=timeout,
                   started=started)  # fmt: skip

    @property
    def deadline(self) -> Deadline | None:
        """When a render must give up, and what that time is, for its error."""
        return _deadline(self.started, self.timeout)

    def left(self) -> float | None:
        """The seconds left of the timeout (never quite none: a call is given a moment)."""
        if self.timeout is None:
            return None
        return max(self.timeout - (time.monotonic() - self.started), 0.001)


def _deadline(started: float, timeout: float | None) -> Deadline | None:
    return None if timeout is None else (started + timeout, f"the node's timeout of {timeout:g} s")


@dataclass(frozen=True, kw_only=True)
class Checking:
    """What a type's config check may consult besides the config itself."""

    node: Mapping[str, Any]  # the node as written
    by_id: Mapping[str, Mapping[str, Any]]  # every node of the definition that has an id
    known_functions: Collection[str] | None  # registered python functions; None: unchecked
    http_allow: AllowList | None  # the operator's CONVEYOR_HTTP_ALLOW; None: unchecked
    # what a registered function takes, to check a python node's inputs; None: unchecked
    parameters: FunctionParameters | None = None
    workflow: str | None = None  # the name of the workflow the node is in (None: unknown)


class ConfigCheck(Protocol):
    """The problems of a node's config, each a sentence naming the key and the fix."""

    def __call__(self, config: Mapping[str, Any], checking: Checking) -> list[str]: ...


class Wait(Protocol):
    """The seconds a ready node's job is held before it runs (from ``now``), from its
    config."""

    def __call__(self, node: Node, context: Mapping[str, Any], now: datetime) -> float: ...


class Executor(Protocol):
    """Run one try; return its output (JSON-serializable) or raise NodeError."""

    def __call__(self, step: Step) -> Any: ...


@dataclass(frozen=True, kw_only=True)
class NodeType:
    """A kind of node: what its config may hold, and what the engine does differently for it."""

    name: str  # what a definition writes in ``type``
    config_keys: frozenset[str]  # any other key is refused, naming these
    check: ConfigCheck
    # Runs a try. None for a type whose try is I/O until the worker attaches it (:func:`attach`).
    execute: Executor | None = None
    # None: its job runs once it is ready. Else its job is held for the seconds this gives.
    wait: Wait | None = None
    # The config keys that list its successors on each branch: its output's ``branch`` names
    # the one taken, and the nodes listed under the others are skipped. Empty: no branches.
    branches: tuple[str, ...] = ()
    # Whether its tries read the node's ``inputs`` (a rerun may give it others); False for a
    # type whose templates are all in its config.
    reads_inputs: bool = True

    # Whether a node of this type may carry ``map`` (a try per item of a list): a type whose
    # try runs a function, a request or a child workflow (a child per item); not one that
    # waits for a time, nor one whose output picks a branch.
    maps: bool = False

    # Its try starts a child execution of the workflow its config names and waits for it,
    # holding no worker slot (conveyor.engine.children): no executor runs it.
    starts_child: bool = False

    # Its try waits for an application event (conveyor.engine.waits), holding no worker slot:
    # no executor runs it, and the branch it takes is the outcome (event or timeout), never
    # read from its output (the event's payload).
    waits_for_event: bool = False

    # Its wait is for a person's decision (conveyor.engine.approvals), not an event a
    # definition names: it is decided by id, approved or rejected.
    asks_a_person: bool = False


_TYPES: dict[str, NodeType] = {}


def register(kind: NodeType) -> NodeType:
    """Add a node type; its name must be free (two modules never claim one)."""
    if kind.name in _TYPES:
        raise ValueError(f"node type {kind.name!r} is already registered; pick another name")
    _TYPES[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    _TYPES.pop(name, None)


def attach(name: str, execute: Executor) -> NodeType:
    """Give the registered type ``name`` its executor: the worker's side of a type whose try
    does I/O, which the engine describes but does not run."""
    _TYPES[name] = replace(_TYPES[name], execute=execute)
    return _TYPES[name]


def named(name: object) -> NodeType | None:
    """The type registered under ``name`` (a definition's raw value), or None."""
    return _TYPES.get(name) if isinstance(name, str) else None


def of(node: Node) -> NodeType | None:
    """The type of ``node``; None for a name no longer registered (a stored definition may
    predate a removal)."""
    return _TYPES.get(node.type)


def names() -> tuple[str, ...]:
    return tuple(_TYPES)


def waits(node: Node) -> bool:
    """Whether ``node``'s job is held until a time its config gives."""
    kind = of(node)
    return kind is not None and kind.wait is not None


def reads_inputs(node: Node) -> bool:
    """Whether ``node``'s tries read its ``inputs`` (what a rerun's input stands in for)."""
    kind = of(node)
    return kind is not None and kind.reads_inputs


def maps(name: object) -> bool:
    """Whether a node of the type registered under ``name`` may carry ``map``."""
    kind = named(name)
    return kind is not None and kind.maps


def starts_child(node: Node) -> bool:
    """Whether ``node``'s try starts a child execution and waits for it (a workflow node)."""
    kind = of(node)
    return kind is not None and kind.starts_child


def waits_for_event(node: Node) -> bool:
    """Whether ``node``'s try waits for an application event (a wait node)."""
    kind = of(node)
    return kind is not None and kind.waits_for_event


def asks_a_person(node: Node) -> bool:
    """Whether ``node``'s try waits for a person's decision (an approval node)."""
    kind = of(node)
    return kind is not None and kind.asks_a_person


def branch_of(node: Node, output: Any) -> str | None:
    """The branch ``node``'s output picks: its ``branch`` for a type whose output chooses
    one (a condition); None for any other (a wait's branch is its outcome, not its output)."""
    kind = of(node)
    if kind is None or not kind.branches or kind.waits_for_event:
        return None
    return output.get("branch") if isinstance(output, Mapping) else None


def branches(node: Node) -> tuple[str, ...]:
    """The config keys listing ``node``'s successors on each branch; empty unless its output
    chooses a branch."""
    kind = of(node)
    return kind.branches if kind is not None else ()


# The built-in types.

PYTHON = "python"  # runs a function registered with @conveyor.node, its inputs as keywords


def _python_problems(config: Mapping[str, Any], checking: Checking) -> list[str]:
    fn = config.get("function")
    if not isinstance(fn, str) or not fn:
        return ["config.function is required: the name a function was registered under"]
    known = checking.known_functions
    if known is not None and fn not in known:
        hint = f" (registered: {', '.join(sorted(known))})" if known else ""
        return [
            f"config.function {fn!r} is not registered{hint}; decorate it with "
            f"@conveyor.node({fn!r}) in a module listed in CONVEYOR_IMPORTS"
        ]
    if checking.parameters is None:
        return []
    return function_input_problems(config, checking.node.get("inputs", {}), checking.parameters)


def function_input_problems(
    config: Mapping[str, Any], inputs: object, parameters: FunctionParameters
) -> list[str]:
    """What a python node's inputs cannot give the function its config names, as
    ``parameters`` says it takes; nothing for a function not registered in this process (it
    is checked when it runs)."""
    fn = config.get("function")
    found = parameters(fn) if isinstance(fn, str) else None
    if found is None or not isinstance(inputs, Mapping):
        return []
    return input_problems(inputs, found)


HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")


def _http_problems(config: Mapping[str, Any], checking: Checking) -> list[str]:
    errors = []
    url = config.get("url")
    if not isinstance(url, str) or not url:
        errors.append("config.url is required, e.g. https://api.example.com/items")
    elif not templates.is_template(url) and not url.startswith(("http://", "https://")):
        errors.append(f"config.url {url!r} must start with http:// or https://")
    method = config.get("method", "GET")
    if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
        errors.append(f"config.method {method!r} is not one of {', '.join(HTTP_METHODS)}")
    for key in ("headers", "params"):
        if key in config and not isinstance(config[key], Mapping):
            errors.append(f"config.{key} must be a mapping of names to values")
    if "json" in config and "body" in config:
        errors.append("config.json and config.body are exclusive; keep one")
    return errors + _address_problems(url, checking.http_allow)


def _address_problems(url: object, allow: AllowList | None) -> list[str]:
    """A literal URL the node would be refused at run time, refused now with the same words;
    a templated one, or a name that resolves to a refused address, is refused when it runs."""
    if allow is None or not isinstance(url, str) or templates.is_template(url):
        return []
    if not url.startswith(("http://", "https://")):
        return []  # reported above
    refusal = judge_url(url, allow)
    return [] if refusal is None else [f"config.url {url!r}: {refusal.message}"]


def _delay_problems(config: Mapping[str, Any], checking: Checking) -> list[str]:
    if "until" in config:
        return _until_problems(config)
    if "timezone" in config:
        return ["config.timezone reads config.until; give an until, or leave the timezone out"]
    seconds = config.get("seconds")
    if isinstance(seconds, str) and templates.is_template(seconds):
        return []
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return [
            f"config.seconds is required: a number of seconds from 0 to "
            f"{bounds.MAX_DELAY_SECONDS}, or a template (or config.until: a time to sleep "
            f"until)"
        ]
    if problem := bounds.delay_problem(seconds):
        return [f"config.seconds: {problem}; give a number from 0 to {bounds.MAX_DELAY_SECONDS}"]
    return []


def _until_problems(config: Mapping[str, Any]) -> list[str]:
    """A delay that sleeps until a time: not beside ``seconds``, its literal time and zone
    ones that read (a template's are checked when it renders)."""
    errors = []
    if "seconds" in config:
        errors.append("config.seconds and config.until are exclusive; keep one")
    until, timezone = config["until"], config.get("timezone")
    if isinstance(timezone, str) and templates.is_template(timezone):
        timezone = None
    try:
        instants.zone(timezone)
        if not (isinstance(until, str) and templates.is_template(until)):
            instants.instant(until, timezone)
    except NonRetryableError as exc:
        errors.append(str(exc))
    return errors


def _delay_seconds(node: Node, context: Mapping[str, Any], now: datetime) -> float:
    """How long a delay node waits from ``now``, rendered from its config: its ``seconds``,
    or the time to its ``until`` (none when that has passed)."""
    if "until" in node.config:
        return max(0.0, _seconds_until(node, context, now))
    value = templates.render_value(node.config["seconds"], context)
    fix = f"config.seconds must give a number of seconds from 0 to {bounds.MAX_DELAY_SECONDS}"
    try:
        if isinstance(value, bool):
            raise TypeError(value)
        # An integer too large for a float (OverflowError) is no delay either.
        seconds = float(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise NonRetryableError(
            f"delay seconds {bounds.shown(value)} is not a number; {fix}"
        ) from exc
    if problem := bounds.delay_problem(seconds):
        raise NonRetryableError(f"{problem}; {fix}")
    return seconds


def _until(node: Node, context: Mapping[str, Any]) -> datetime:
    """The moment a delay with ``until`` sleeps until, rendered from its config."""
    until = templates.render_value(node.config["until"], context)
    timezone = templates.render_value(node.config.get("timezone"), context)
    return instants.instant(until, timezone)


def _seconds_until(node: Node, context: Mapping[str, Any], now: datetime) -> float:
    seconds = (_until(node, context) - now).total_seconds()
    if seconds > 0 and (problem := bounds.delay_problem(seconds)):
        raise NonRetryableError(f"config.until: {problem}; give a nearer time")
    return seconds


def _delayed(step: Step) -> dict[str, Any]:
    """The try that runs once the wait is over: it only reports the wait."""
    if "until" in step.node.config:
        return {"delayed_until": _until(step.node, step.context).isoformat()}
    return {"delayed_seconds": _delay_seconds(step.node, step.context, datetime.now(UTC))}


_IF = ("if_true", "if_false")


def _condition_problems(config: Mapping[str, Any], checking: Checking) -> list[str]:
    errors = []
    expression = config.get("expression")
    if not isinstance(expression, str) or not expression.strip():
        errors.append('config.expression is required, e.g. "input.amount > 100"')
    elif problem := templates.syntax_error(expression, expression=True):
        errors.append(f"config.expression {expression!r} does not parse: {problem}")
    branched = 0
    for key in _IF:
        targets = config.get(key, [])
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            errors.append(f"config.{key} must be a list of node ids")
            continue
        branched += len(targets)
        errors += [p for target in targets if (p := _branch_problem(key, target, checking))]
    if not branched:
        errors.append("config.if_true or config.if_false must name at least one node")
    return errors


def _branch_problem(key: str, target: str, checking: Checking) -> str | None:
    """Why ``target`` cannot sit on the branch ``key``: it must be a node that needs this one."""
    owner = checking.node.get("id")
    if target not in checking.by_id:
        return f"config.{key} names {target!r}, which is not a node; fix the name"
    needs = checking.by_id[target].get("needs", [])
    if not isinstance(needs, list) or owner not in [n for n in needs if isinstance(n, str)]:
        return (
            f"config.{key} names {target!r}, which does not need {owner!r}; "
            f"add {owner!r} to the needs of {target!r}"
        )
    return None


def _evaluated(step: Step) -> dict[str, Any]:
    """The expression's truth, and the branch it takes."""
    scope = {**step.context, "inputs": step.inputs}
    value = templates.evaluate(step.node.config["expression"], scope, deadline=step.deadline)
    return {"result": bool(value), "branch": _IF[0] if value else _IF[1]}


WAIT_BRANCHES = ("on_event", "on_timeout")
# How many characters an event's name and its correlation key may have (their columns').
MAX_EVENT_NAME = 200
MAX_EVENT_KEY = 200


def _wait_problems(config: Mapping[str, Any], checking: Checking) -> list[str]:
    errors = []
    event = config.get("event")
    if not isinstance(event, str) or not event.strip() or len(event) > MAX_EVENT_NAME:
        errors.append(
            f"config.event is required: the name of the event to wait for, e.g. "
            f'"payment.confirmed" (at most {MAX_EVENT_NAME} characters)'
        )
    key = config.get("key")
    if not isinstance(key, str) or not key.strip():
        errors.append(
            "config.key is required: the correlation key the event must carry, usually a "
            'template, e.g. "{{ input.order_id }}"'
        )
    elif problem := templates.syntax_error(key):
        errors.append(f"config.key {key!r} does not parse: {problem}")
    return errors + _waiting_problems(config, checking, WAIT_BRANCHES)


def _waiting_problems(
    config: Mapping[str, Any], checking: Checking, branches: tuple[str, ...]
) -> list[str]:
    """The problems of the config a wait and an approval share: the timeout and branches."""
    errors = _timeout_problems(config.get("timeout"))
    for branch in branches:
        targets = config.get(branch, [])
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            errors.append(f"config.{branch} must be a list of node ids")
            continue
        errors += [p for target in targets if (p := _branch_problem(branch, target, checking))]
    if config.get("on_timeout") and "timeout" not in config:
        errors.append("config.on_timeout names nodes but config.timeout is not given; add one")
    return errors


APPROVAL_BRANCHES = ("on_approve", "on_reject", "on_timeout")


def _approval_problems(config: Mapping[str, Any], checking: Checking) -> list[str]:
    message = config.get("message", "")
    errors = []
    if not isinstance(message, str):
        errors.append('config.message must be text: what the approver is asked, e.g. "Export?"')
    return errors + _waiting_problems(config, checking, APPROVAL_BRANCHES)


def _timeout_problems(timeout: object) -> list[str]:
    if timeout is None or (isinstance(timeout, str) and templates.is_template(timeout)):
        return []
    fix = (
        f"config.timeout must be a number of seconds (more than 0, at most "
        f"{bounds.MAX_DELAY_SECONDS}), or a template giving seconds or an ISO 8601 time"
    )
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return [fix]
    if timeout <= 0 or bounds.delay_problem(timeout):
        return [f"{fix}, not {bounds.shown(timeout)}"]
    return []


def _workflow_problems(config: Mapping[str, Any], checking: Checking) -> list[str]:
    name, version = config.get("workflow"), config.get("version")
    errors = []
    if not isinstance(name, str) or not WORKFLOW_NAME.fullmatch(name):
        errors.append(
            "config.workflow is required: the name of the workflow to start as a child "
            "(letters, digits, '_', '.', '-')"
        )
    elif name == checking.workflow:
        errors.append(
            f"config.workflow names {name!r}, the workflow this node is in: a workflow may "
            f"not start itself; name another workflow"
        )
    if "version" in config and (
        isinstance(version, bool) or not isinstance(version, int) or version < 1
    ):
        errors.append(
            f"config.version {version!r} must be a version number (1 or more); leave it out "
            f"to run the version current when the node starts"
        )
    return errors


# The tries of these two are I/O: the worker attaches their executors (conveyor.nodes).
register(
    NodeType(name=PYTHON, config_keys=frozenset({"function"}), check=_python_problems, maps=True)
)
register(
    NodeType(
        name="http",
        config_keys=frozenset({"url", "method", "headers", "params", "json", "body"}),
        check=_http_problems,
        reads_inputs=False,
        maps=True,
    )
)
register(
    NodeType(
        name="delay",
        config_keys=frozenset({"seconds", "until", "timezone"}),
        check=_delay_problems,
        execute=_delayed,
        wait=_delay_seconds,
        reads_inputs=False,
    )
)
register(
    NodeType(
        name="condition",
        config_keys=frozenset({"expression", *_IF}),
        check=_condition_problems,
        execute=_evaluated,
        branches=_IF,
    )
)
register(
    NodeType(
        name="workflow",
        config_keys=frozenset({"workflow", "version"}),
        check=_workflow_problems,
        starts_child=True,
        maps=True,  # a child per item, each item's try waiting for its own child
    )
)
register(
    NodeType(
        name="wait",
        config_keys=frozenset({"event", "key", "timeout", *WAIT_BRANCHES}),
        check=_wait_problems,
        branches=WAIT_BRANCHES,
        reads_inputs=False,
        waits_for_event=True,
    )
)
register(
    NodeType(
        name="approval",
        config_keys=frozenset({"message", "timeout", *APPROVAL_BRANCHES}),
        check=_approval_problems,
        branches=APPROVAL_BRANCHES,
        reads_inputs=False,
        waits_for_event=True,
        asks_a_person=True,
    )
)
