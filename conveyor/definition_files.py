"""Definition files read strictly: YAML or JSON, at most ``CONVEYOR_MAX_DEFINITION_BYTES``.

A plain YAML or JSON reader keeps the last of two equal keys and says nothing, so a file with
``nodes:`` twice lost its first node list silently; here a key repeated in one mapping is an
error naming it and its lines. YAML anchors and aliases are refused: a few lines of nested
aliases ("billion laughs") expand to more values than memory holds, and a definition has no
need of them. Nesting past ``CONVEYOR_MAX_JSON_DEPTH`` is left to validation, which names it;
nesting past what the reader itself can recurse through is refused here.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.error import Mark
from yaml.nodes import MappingNode, Node, ScalarNode

from conveyor.engine import bounds
from conveyor.exceptions import DefinitionFileError

SUFFIXES = (".yaml", ".yml", ".json")


def load_definition(path: Path, *, max_bytes: int) -> Any:
    """The parsed content of a definition file, or :class:`DefinitionFileError` naming the
    file, the line where there is one, and the fix."""
    if path.suffix.lower() not in SUFFIXES:
        raise DefinitionFileError(f"{path}: unsupported file type; use .yaml, .yml or .json")
    try:
        with path.open("rb") as file:
            raw = file.read(max_bytes + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DefinitionFileError(f"{path}: cannot be read: {exc}") from exc
    if len(raw) > max_bytes:
        setting = "CONVEYOR_MAX_DEFINITION_BYTES"
        message = bounds.too_large("the file", None, max_bytes, setting, fix="split it")
        raise DefinitionFileError(f"{path}: {message}")
    parse = parse_json if path.suffix.lower() == ".json" else parse_yaml
    try:
        return parse(text)
    except DefinitionFileError as exc:
        raise DefinitionFileError(f"{path}{exc}") from exc


def parse_yaml(text: str) -> Any:
    """YAML without repeated keys, anchors or aliases; errors start ``:LINE: ``."""
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or str(exc)
        raise DefinitionFileError(f"{line}: invalid YAML: {problem}") from exc
    except yaml.YAMLError as exc:
        raise DefinitionFileError(f": invalid YAML: {exc}") from exc
    except RecursionError as exc:
        raise DefinitionFileError(f": {_TOO_DEEP}") from exc
    finally:
        loader.dispose()


def parse_json(text: str) -> Any:
    """JSON without repeated keys, NaN or Infinity; errors start ``:LINE: `` when known."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise DefinitionFileError(f":{exc.lineno}: invalid JSON: {exc.msg}") from exc
    except RecursionError as exc:
        raise DefinitionFileError(f": {_TOO_DEEP}") from exc


# A file nested this deep is refused however CONVEYOR_MAX_JSON_DEPTH is set (its maximum is
# 200); the readers recurse once a level and would exhaust the interpreter's stack first.
_DEEPEST = 200
_TOO_DEEP = (
    f"the file is nested more than {_DEEPEST} levels deep, deeper than any definition may be "
    f"(CONVEYOR_MAX_JSON_DEPTH is at most {_DEEPEST}); flatten it"
)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing anchors, aliases, merge keys and repeated keys."""

    _depth = 0  # nodes being composed, one inside the other

    def fetch_flow_collection_start(self, TokenClass: type[yaml.Token]) -> None:  # noqa: N803
        # The scanner looks back over every open flow level at each token: a file of
        # thousands of '[' took seconds (quadratic) before the composer saw its depth.
        super().fetch_flow_collection_start(TokenClass)
        if self.flow_level > _DEEPEST:
            raise yaml.MarkedYAMLError(problem=_TOO_DEEP, problem_mark=self.get_mark())

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        anchor = getattr(event, "anchor", None)
        if isinstance(event, yaml.AliasEvent):
            raise _refused(event, f"alias *{anchor} refused: write the value out in full")
        if anchor is not None:
            raise _refused(event, f"anchor &{anchor} refused: write each value out in full")
        if self._depth >= _DEEPEST:
            raise _refused(event, _TOO_DEEP)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _refused(key_node, "merge key << refused: write the keys out in full")
            if not isinstance(key_node, ScalarNode):
                continue  # a definition's keys are scalars; the model refuses the rest
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in first:
                raise _refused(
                    key_node,
                    f"key {key!r} appears twice in one mapping (lines {first[key]} and "
                    f"{line}); keep one (a YAML reader would silently keep the last)",
                )
            first[key] = line
        return super().construct_mapping(node, deep=deep)


def _refused(at: yaml.Event | Node, problem: str) -> yaml.MarkedYAMLError:
    mark = at.start_mark
    return yaml.MarkedYAMLError(
        problem=problem, problem_mark=mark if isinstance(mark, Mark) else None
    )


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise DefinitionFileError(
                f": key {key!r} appears twice in one object; keep one (a JSON reader would "
                f"silently keep the last)"
            )
        found[key] = value
    return found


def _no_constant(constant: str) -> Any:
    raise DefinitionFileError(f": {constant} is not JSON; write a finite number or null")
