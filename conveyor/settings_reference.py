"""The settings reference, docs/settings.md, made from :class:`conveyor.config.Settings`: every
``CONVEYOR_*`` variable with its type, bounds, default and description. The class is the one
source; the file is regenerated whenever a setting changes, and a unit test fails while the
file and the class disagree::

    python -m conveyor.settings_reference          # rewrites docs/settings.md
    python -m conveyor.settings_reference --check  # exits 1 if it is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from annotated_types import Ge, Gt, Le, Lt
from pydantic.fields import FieldInfo

from conveyor.config import Settings

COMMAND = "python -m conveyor.settings_reference"
DOCUMENT = Path(__file__).resolve().parent.parent / "docs" / "settings.md"

HEADER = f"""\
# Settings

Conveyor reads its settings from `CONVEYOR_*` environment variables, once per process (the
API, each worker, beat and the CLI read their own). With none set it runs embedded: SQLite
under `./.conveyor/`, an in-process broker and worker threads inside the `conveyor` process.
A value out of its bounds stops the process with a message naming the setting. Lists are
comma-separated (`CONVEYOR_IMPORTS=shop.nodes,shop.more`) or a JSON list.

This page is generated from `conveyor/config.py` by `{COMMAND}`:
edit the descriptions there, not here.

| variable | type | default | description |
| --- | --- | --- | --- |
"""

_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def type_of(field: FieldInfo) -> str:
    """The value's kind in words, with the bounds the class enforces."""
    kind = _TYPES.get(field.annotation, "list of strings")  # type: ignore[arg-type]
    bounds = []
    for item in field.metadata:
        if isinstance(item, Ge):
            bounds.append(f"≥ {item.ge}")
        elif isinstance(item, Gt):
            bounds.append(f"> {item.gt}")
        elif isinstance(item, Le):
            bounds.append(f"≤ {item.le}")
        elif isinstance(item, Lt):
            bounds.append(f"< {item.lt}")
        elif choices := _choices(getattr(item, "pattern", None)):
            kind = " or ".join(f"`{choice}`" for choice in choices)
    return ", ".join([kind, *bounds])


def _choices(pattern: str | None) -> list[str]:
    # a pattern such as ^(json|console)$ is a choice among words
    match = re.fullmatch(r"\^\(([\w|]+)\)\$", pattern or "")
    return match.group(1).split("|") if match else []


def default_of(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value in ("", []):
        return "(empty)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("*", "\\*")


def render() -> str:
    """docs/settings.md as the settings class describes it now."""
    rows = []
    prefix = Settings.model_config.get("env_prefix", "")
    for name, field in Settings.model_fields.items():
        variable = f"`{prefix}{name.upper()}`"
        description = _cell(field.description or "")
        rows.append(f"| {variable} | {type_of(field)} | {default_of(field)} | {description} |")
    return HEADER + "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        if DOCUMENT.exists() and DOCUMENT.read_text() == text:
            return 0
        print(f"{DOCUMENT} is out of date: run `{COMMAND}`", file=sys.stderr)
        return 1
    if argv:
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    DOCUMENT.write_text(text)
    print(f"wrote {DOCUMENT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
