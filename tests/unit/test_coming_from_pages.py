"""The "coming from ..." pages and their examples agree, checked without running anything (the
acceptance tier runs them: tests/acceptance/test_coming_from.py): each page's "Run it" block
goes into its example's directory, imports the node module found there, applies definition
files found there, and those definitions are valid against the module's functions."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest

from conveyor.definition_files import load_definition
from conveyor.engine.validation import parse_workflow
from conveyor.migrations import ROOT
from conveyor.nodes import function_parameters, registered_functions
from tests.support.doc_blocks import block_under

PAGES = {
    "coming-from-skip-locked.md": "skip-locked",
    "coming-from-async-operations.md": "async-operations",
    "coming-from-a-queue-consumer.md": "queue-consumer",
}


def load_module(path: Path) -> None:
    """Import an example's node module from its file, which registers its functions."""
    spec = importlib.util.spec_from_file_location(f"coming_from_{path.stem}", path)
    assert spec and spec.loader
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


@pytest.mark.parametrize(("page", "example"), PAGES.items())
def test_a_page_runs_its_own_example_whose_definitions_fit_its_node_functions(
    page: str, example: str
) -> None:
    commands = [
        shlex.split(c, comments=True) for c in block_under(ROOT / "docs" / page, "## Run it")
    ]
    here = ROOT / "examples" / "coming-from" / example

    # The block goes into the example's directory and imports the module that is there
    assert commands[0] == ["cd", f"examples/coming-from/{example}"]
    imports = next(
        w.partition("=")[2] for c in commands for w in c if w.startswith("CONVEYOR_IMPORTS=")
    )
    module = here / f"{imports}.py"
    assert module.is_file(), f"{page}: CONVEYOR_IMPORTS={imports}, but there is no {module.name}"
    load_module(module)

    # And every file it applies is there, and valid against the functions the module registers
    (applied,) = [c[3:] for c in commands if c[1:3] == ["workflow", "apply"]]
    assert applied
    for name in applied:
        definition = load_definition(here / name, max_bytes=1 << 20)
        workflow = parse_workflow(definition, known_functions=registered_functions(),
                                  parameters=function_parameters)  # fmt: skip
        # And the page runs it
        runs = [c[c.index("run") + 1] for c in commands if c[0] == "conveyor" and "run" in c]
        assert workflow.name in runs, (page, workflow.name)
