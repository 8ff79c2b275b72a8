"""Mypy checks the wiring of a workflow written in Python: the examples pass mypy --strict,
and a wrong field read on a parent's output (a model's attribute, a TypedDict's key) or on a
typed workflow's result is a mypy error at its line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BROKEN = """\
from typing import TypedDict

from pydantic import BaseModel

import conveyor


class Page(BaseModel):
    body: str


class Count(TypedDict):
    words: int


flow = conveyor.Flow("broken", output=Count)


@flow.node()
def fetch() -> Page:
    return Page(body="a b")


@flow.node(inputs={"text": fetch.out.bdy})
def count(text: str) -> Count:
    return {"words": len(text.split())}


flow.returns({"words": count.out["wrds"]})


def total(client: conveyor.Client) -> int:
    return client.run(flow, None)["word"]
"""


@pytest.mark.timeout(600)  # mypy reads conveyor's modules the flows import, once per cache
def test_mypy_passes_the_examples_and_names_each_wrong_field_read(tmp_path: Path) -> None:
    broken = tmp_path / "broken_flow.py"
    broken.write_text(BROKEN)

    found = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", str(ROOT / "examples" / "python"), str(broken)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )

    errors = [line for line in found.stdout.splitlines() if ": error:" in line]
    # mypy's cache may name an earlier run's copy of the same file: its name is what counts
    assert all(e.split(":")[0].endswith("/broken_flow.py") for e in errors), found.stdout
    at = {int(e.split(":")[1]): e for e in errors if "[no-any-return]" not in e}
    assert sorted(at) == [24, 29, 33], found.stdout
    assert '"Page" has no attribute "bdy"' in at[24]
    assert '"wrds" is not a valid TypedDict key' in at[29]
    assert 'TypedDict "Count" has no key "word"' in at[33]
