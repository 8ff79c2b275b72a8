"""Definition files as the CLI reads them: validated all first, every problem printed, then
stored. Shared by ``conveyor workflow`` and by ``conveyor run`` / ``conveyor demo``, which
apply files before they start runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from conveyor import wiring
from conveyor.cli import render
from conveyor.cli.common import load_imports, who_fires
from conveyor.config import get_settings
from conveyor.definition_files import load_definition
from conveyor.engine.definitions import Workflow
from conveyor.engine.validation import validate
from conveyor.exceptions import ConveyorError


def load_file(path: Path) -> Any:
    """The parsed content of a YAML or JSON definition file, read strictly (see
    :mod:`conveyor.definition_files`); ConveyorError names the line."""
    return load_definition(path, max_bytes=get_settings().max_definition_bytes)


def known_functions() -> frozenset[str] | None:
    """The registered functions when CONVEYOR_IMPORTS names modules; else no check."""
    load_imports()
    return wiring.known_functions()


def check_files(paths: Sequence[Path], *, say_valid: bool = False) -> dict[Path, Workflow]:
    """Validate every file, print every problem, and exit 1 if there is any."""
    known, parameters = known_functions(), wiring.function_parameters()
    valid: dict[Path, Workflow] = {}
    for path in paths:
        try:
            data = load_file(path)
        except ConveyorError as exc:
            render.err.print(str(exc), style="red", markup=False, soft_wrap=True)
            continue
        errors = validate(
            data,
            known_functions=known,
            http_allow=wiring.http_allow(),
            bounds=get_settings().bounds,
            parameters=parameters,
        )
        for error in errors:
            render.err.print(f"{path}: {error}", style="red", markup=False, soft_wrap=True)
        if not errors:
            valid[path] = Workflow.model_validate(data)
            if say_valid:
                render.out.print(f"{path}: valid", markup=False)
    if len(valid) < len(paths):
        raise typer.Exit(1)
    return valid


def apply_files(paths: Sequence[Path], tenant: str, console: Console = render.out) -> list[str]:
    """Validate all, then store each; the names applied, each reported on ``console``, and
    what starts the runs of the schedules they declare."""
    return _store(list(check_files(paths).values()), tenant, console)


def apply_modules(modules: Sequence[str], tenant: str, console: Console = render.out) -> list[str]:
    """The flows the modules declare, validated all (an error names the line that declared
    the faulty node), then stored as :func:`apply_files` stores files."""
    return _store(wiring.flow_definitions(modules, "--module"), tenant, console)


def _store(workflows: Sequence[Workflow], tenant: str, console: Console) -> list[str]:
    service = wiring.service()
    for workflow in workflows:
        record, stored = service.apply(workflow, tenant)
        state = (
            f"stored version {record.version}"
            if stored
            else f"unchanged (version {record.version})"
        )
        console.print(f"{record.name}: {state}", markup=False)
    if scheduled := [w.name for w in workflows if w.schedules]:
        whose = f"the schedules of {', '.join(scheduled)}: their"
        console.print(who_fires(whose), markup=False, soft_wrap=True)
    return [w.name for w in workflows]
