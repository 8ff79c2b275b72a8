"""Validation of workflow definitions: every error at once, each naming the node and the fix.

Pure: a definition (parsed YAML/JSON or a :class:`Workflow`) in, a list of messages out.
Structure errors from pydantic and cross-node errors (duplicates, missing needs, cycles, unknown
types, branch and template references) are reported together. What a node's config may hold is
its type's to say (:mod:`conveyor.engine.node_types`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import ValidationError

from conveyor.engine import node_types, templates
from conveyor.engine.addresses import AllowList
from conveyor.engine.bounds import MAX_TEMPLATE_TEXT, Bounds, deeper_than, too_deep
from conveyor.engine.definitions import Workflow
from conveyor.engine.node_types import Checking
from conveyor.engine.parameters import FunctionParameters
from conveyor.exceptions import DefinitionError


def parse_workflow(
    data: Mapping[str, Any] | Workflow,
    *,
    source: str | None = None,
    known_functions: Collection[str] | None = None,
    http_allow: AllowList | None = None,
    bounds: Bounds | None = None,
    parameters: FunctionParameters | None = None,
) -> Workflow:
    """A valid :class:`Workflow`, or :class:`DefinitionError` listing every problem."""
    raw = data.model_dump(mode="json") if isinstance(data, Workflow) else data
    errors = validate(
        raw,
        known_functions=known_functions,
        http_allow=http_allow,
        bounds=bounds,
        parameters=parameters,
    )
    if errors:
        raise DefinitionError(errors, source)
    return Workflow.model_validate(raw)


def validate(
    data: Mapping[str, Any],
    *,
    known_functions: Collection[str] | None = None,
    http_allow: AllowList | None = None,
    bounds: Bounds | None = None,
    parameters: FunctionParameters | None = None,
) -> list[str]:
    """Every problem in a definition; an empty list means it is valid.

    ``known_functions``, when given, is the set of registered python-node functions; a node
    naming any other function is an error. ``http_allow``, when given, is the operator's
    ``CONVEYOR_HTTP_ALLOW``: an http node whose URL (not a template) the http node would
    refuse to call is an error. ``bounds`` (default: the settings' defaults) caps
    the nesting, the nodes and each node's needs; past them only that is reported, so the
    work done here stays linear in the definition's size and bounded by them.
    ``parameters``, when given, tells what a registered function takes: a python node whose
    inputs its function cannot take, or that leaves out a parameter without a default, is an
    error; a function it does not know (None) is not checked.
    """
    bounds = bounds or Bounds()
    if not isinstance(data, Mapping):
        return ["the definition must be a mapping with 'name' and 'nodes'"]
    if deeper_than(data, bounds.json_depth):
        return [f"workflow: {too_deep('the definition', bounds.json_depth)}"]
    raw_nodes = data.get("nodes")
    nodes = [n for n in raw_nodes if isinstance(n, Mapping)] if isinstance(raw_nodes, list) else []
    if over := _count_errors(nodes, bounds) or _template_text_errors(data, nodes):
        return over
    by_id = {n["id"]: n for n in nodes if isinstance(n.get("id"), str)}
    errors = _structure_errors(data, nodes)
    errors += _graph_errors(nodes)
    for index, node in enumerate(nodes):
        checking = Checking(
            node=node,
            by_id=by_id,
            known_functions=known_functions,
            http_allow=http_allow,
            parameters=parameters,
            workflow=name if isinstance(name := data.get("name"), str) else None,
        )
        errors += _node_errors(_label(nodes, index), node, checking)
    errors += _output_errors(data.get("output"), _ids(nodes))
    errors += _schedule_errors(data)
    return list(dict.fromkeys(errors))


def input_errors(workflow: Workflow, parameters: FunctionParameters) -> list[str]:
    """Each python node's inputs that its function cannot take, as :func:`validate` words
    them given ``parameters``: that check alone, for a definition valid otherwise that may
    not have passed it (a :class:`Workflow` built in Python and applied, see
    :meth:`conveyor.service.Clients.apply`)."""
    return [
        f"node {node.id!r}: {problem}"
        for node in workflow.nodes
        if node.type == node_types.PYTHON
        for problem in node_types.function_input_problems(node.config, node.inputs, parameters)
    ]


def _count_errors(nodes: list[Mapping[str, Any]], bounds: Bounds) -> list[str]:
    """The nodes past CONVEYOR_MAX_NODES, or the needs past CONVEYOR_MAX_NEEDS."""
    if len(nodes) > bounds.nodes:
        return [
            f"workflow: nodes: {len(nodes)} nodes, over the limit of {bounds.nodes} "
            f"(CONVEYOR_MAX_NODES); split the workflow, or raise CONVEYOR_MAX_NODES"
        ]
    return [
        f"{_label(nodes, index)}: needs: {len(needs)} needs, over the limit of {bounds.needs} "
        f"(CONVEYOR_MAX_NEEDS); join through fewer nodes, or raise CONVEYOR_MAX_NEEDS"
        for index, node in enumerate(nodes)
        if isinstance(needs := node.get("needs"), list) and len(needs) > bounds.needs
    ]


def _template_text_errors(data: Mapping[str, Any], nodes: list[Mapping[str, Any]]) -> list[str]:
    """The templates' text past MAX_TEMPLATE_TEXT: parsing them is most of what validating
    costs, and it holds a thread of the API."""
    sections = [n.get(key) for n in nodes for key in ("inputs", "config", "map")]
    expressions = [
        c["expression"]
        for n in nodes
        if isinstance(c := n.get("config"), Mapping) and isinstance(c.get("expression"), str)
    ]
    total = sum(len(s) for s in _template_strings([*sections, data.get("output")]))
    total += sum(len(e) for e in expressions)
    if total <= MAX_TEMPLATE_TEXT:
        return []
    return [
        f"workflow: its templates hold {total:,} characters, over the limit of "
        f"{MAX_TEMPLATE_TEXT:,} for one definition; move the data into the input, or split "
        f"the workflow"
    ]


def _label(nodes: list[Mapping[str, Any]], index: int) -> str:
    node_id = nodes[index].get("id") if index < len(nodes) else None
    return f"node {node_id!r}" if isinstance(node_id, str) else f"nodes[{index}]"


def _structure_errors(data: Mapping[str, Any], nodes: list[Mapping[str, Any]]) -> list[str]:
    try:
        Workflow.model_validate(data)
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            loc = list(err["loc"])
            if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
                where = _label(nodes, loc[1])
                field = ".".join(str(p) for p in loc[2:]) or "node"
            else:
                where = "workflow"
                field = ".".join(str(p) for p in loc) or "definition"
            if field == "type" and where != "workflow":
                continue  # reported with the list of known types below
            out.append(f"{where}: {field}: {_pydantic_message(err)}")
        return out
    return []


def _pydantic_message(err: Any) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown field; remove it (see docs/definitions.md for the fields)"
    if err["type"] == "missing":
        return "required; add it"
    if err["type"] == "value_error" and "error" in err.get("ctx", {}):
        return str(err["ctx"]["error"])
    return str(err["msg"])


def _ids(nodes: list[Mapping[str, Any]]) -> list[str]:
    return [n["id"] for n in nodes if isinstance(n.get("id"), str)]


def _needs(node: Mapping[str, Any]) -> list[str]:
    needs = node.get("needs", [])
    return [n for n in needs if isinstance(n, str)] if isinstance(needs, list) else []


def _graph_errors(nodes: list[Mapping[str, Any]]) -> list[str]:
    errors = []
    ids = _ids(nodes)
    seen: set[str] = set()
    for node_id in ids:
        if node_id in seen:
            errors.append(f"node {node_id!r}: duplicate id; give each node a unique id")
        seen.add(node_id)
    for node in nodes:
        owner = node.get("id")
        needs = _needs(node)
        for need in sorted(n for n, times in Counter(needs).items() if times > 1):
            errors.append(f"node {owner!r}: needs {need!r} more than once; list it once")
        for need in needs:
            if need not in seen:
                errors.append(
                    f"node {owner!r}: needs {need!r}, which is not a node of this workflow; "
                    f"fix the name or add the node"
                )
            elif need == owner:
                errors.append(f"node {owner!r}: needs itself; remove {need!r} from its needs")
    cycle = find_cycle({n["id"]: _needs(n) for n in nodes if isinstance(n.get("id"), str)})
    if cycle and len(cycle) > 2:
        path = " -> ".join(cycle)
        errors.append(
            f"cycle between nodes {', '.join(repr(c) for c in cycle[:-1])} ({path}); "
            f"remove one of these needs so the graph is acyclic"
        )
    return errors


def find_cycle(needs: Mapping[str, list[str]]) -> list[str] | None:
    """One cycle as a closed path (first id repeated at the end), or None if acyclic."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    # Each node's needs within the graph, listed once: a node is resumed once per need, and
    # filtering its list at each resume would be quadratic in its needs.
    edges = {node: [d for d in dict.fromkeys(deps) if d in needs] for node, deps in needs.items()}
    for start in needs:
        if state.get(start):
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = []
        while stack:
            node, i = stack.pop()
            if i == 0:
                state[node] = 1
                path.append(node)
            deps = edges[node]
            if i < len(deps):
                stack.append((node, i + 1))
                dep = deps[i]
                if state.get(dep) == 1:
                    return [*path[path.index(dep) :], dep]
                if not state.get(dep):
                    stack.append((dep, 0))
            else:
                state[node] = 2
                path.pop()
    return None


def _node_errors(label: str, node: Mapping[str, Any], checking: Checking) -> list[str]:
    kind = node_types.named(node.get("type"))
    if kind is None:
        return [
            f"{label}: unknown type {node.get('type')!r}; use one of "
            f"{', '.join(node_types.names())} "
            f"(python code is registered with @conveyor.node and named in config.function)"
        ]
    config = node.get("config", {})
    if not isinstance(config, Mapping):
        return []  # reported as a structure error
    errors = [
        f"{label}: config.{key} is not a {kind.name} setting; use {sorted(kind.config_keys)}"
        for key in config
        if key not in kind.config_keys
    ]
    errors += [f"{label}: {e}" for e in kind.check(config, checking)]
    errors += [f"{label}: {e}" for e in _template_errors(node)]
    errors += [f"{label}: {e}" for e in _map_errors(node)]
    return errors


def _map_errors(node: Mapping[str, Any]) -> list[str]:
    """A map on a type that cannot map, or an ``over`` that is no template of its needs."""
    spec = node.get("map")
    if not isinstance(spec, Mapping):
        return []  # none, or a wrong type (a structure error)
    kind = node.get("type")
    if not node_types.maps(kind):
        mappable = ", ".join(n for n in node_types.names() if node_types.maps(n))
        return [
            f"map: a {kind} node cannot map; only nodes that run a function, a request or a "
            f"child workflow can ({mappable}): remove map, or map a node of one of those types"
        ]
    over = spec.get("over")
    if not isinstance(over, str) or not over:
        return []  # a structure error
    if not templates.is_template(over):
        return [
            f"map.over {over!r} is not a template; give one that gives the list, e.g. "
            f"'{{{{ input.orders }}}}' or '{{{{ nodes.fetch.rows }}}}'"
        ]
    reading = templates.read(over)
    if reading.problem:
        return [f"map.over: template {over!r} does not parse: {reading.problem}"]
    return [
        f"map.over refers to nodes.{ref}, but {ref!r} is not in needs; add it to needs (a "
        f"node reads only its predecessors' outputs)"
        for ref in sorted(reading.nodes - set(_needs(node)))
    ]


def _template_errors(node: Mapping[str, Any]) -> list[str]:
    errors = []
    needs = set(_needs(node))
    for key in ("inputs", "config"):
        section = node.get(key)
        if not isinstance(section, Mapping):
            continue
        for name, value in section.items():
            if key == "config" and name == "expression":
                refs = templates.referenced_nodes(value, expression=True)
            else:
                refs = set()
                for text in _template_strings(value):  # each parsed once
                    reading = templates.read(text)
                    if reading.problem:
                        errors.append(
                            f"{key}.{name}: template {text!r} does not parse: {reading.problem}"
                        )
                    refs |= reading.nodes
            for ref in sorted(refs - needs):
                errors.append(
                    f"{key}.{name} refers to nodes.{ref}, but {ref!r} is not in needs; "
                    f"add it to needs (a node reads only its predecessors' outputs)"
                )
    return errors


def _output_errors(output: Any, ids: list[str]) -> list[str]:
    if not isinstance(output, Mapping):
        return []  # a wrong type is a structure error
    errors = []
    for name, value in output.items():
        for text in _template_strings(value):
            if problem := templates.syntax_error(text):
                errors.append(
                    f"workflow: output.{name}: template {text!r} does not parse: {problem}"
                )
        for ref in sorted(templates.referenced_nodes(value) - set(ids)):
            errors.append(
                f"workflow: output.{name} refers to nodes.{ref}, which is not a node of this "
                f"workflow; fix the name"
            )
    return errors


def _schedule_errors(data: Mapping[str, Any]) -> list[str]:
    schedules = data.get("schedules")
    if not isinstance(schedules, list):
        return []
    named: dict[str, int] = {}
    errors = []
    for index, spec in enumerate(schedules):
        if not isinstance(spec, Mapping):
            continue
        name = spec.get("name") or data.get("name")
        if not isinstance(name, str):
            continue
        if not spec.get("name") and len(name) > 100:
            errors.append(
                f"workflow: schedules.{index}: the workflow's name is too long to name the "
                f"schedule (100 characters at most); give it a `name`"
            )
        if name in named:
            errors.append(
                f"workflow: schedules.{index}: schedules {named[name]} and {index} are both "
                f"named {name!r}; give each a distinct `name`"
            )
        named.setdefault(name, index)
    return errors


def _template_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if templates.is_template(value) else []
    if isinstance(value, list):
        return [s for v in value for s in _template_strings(v)]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _template_strings(v)]
    return []
