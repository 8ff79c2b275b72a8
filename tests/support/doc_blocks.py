"""A page's code blocks, read from the markdown, its shell blocks run as a reader runs them, so
that the test of an example runs the code and the commands its page shows and the page cannot
drift from them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FENCED = re.compile(r"^```([\w-]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6} .+$", re.MULTILINE)


def block_under(page: Path, heading: str) -> list[str]:
    """The commands of the first ```sh block between ``heading`` (a whole line, e.g.
    ``## Run it``) and the next heading: one per line, a trailing backslash joining lines,
    blank lines and whole-line comments left out."""
    blocks = blocks_under(page, heading, "sh")
    assert blocks, f"{page.name}: no ```sh block under {heading!r}"
    return commands_of(blocks[0])


def blocks_under(page: Path, heading: str, language: str) -> list[str]:
    """The text of every ```LANGUAGE block between ``heading`` and the next heading, in
    order."""
    text = page.read_text()
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = _section_end(text, start)
    return [m.group(2) for m in FENCED.finditer(text, start, end) if m.group(1) == language]


def commands_of(block: str) -> list[str]:
    """A shell block's commands: one per line, a trailing backslash joining lines, blank
    lines and whole-line comments left out."""
    joined = block.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]


def _section_end(text: str, position: int) -> int:
    """Where the next heading after ``position`` starts (a fenced block's lines starting with
    # are no heading: a shell comment, a YAML one)."""
    while (heading := HEADING.search(text, position)) is not None:
        block = FENCED.search(text, position)
        if block is None or heading.start() < block.start():
            return heading.start()
        position = block.end()
    return len(text)


@dataclass(frozen=True)
class Ran:
    command: str
    returncode: int
    stdout: str
    stderr: str


def reader_env() -> dict[str, str]:
    """A reader's shell: no CONVEYOR_* settings, no PYTHONPATH, and this virtualenv's
    ``conveyor`` first on the PATH (the reader installed Conveyor)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_") and k != "PYTHONPATH"
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "200"  # tables as a wide terminal shows them, not cut at 80 columns
    return env


def run_block(
    commands: list[str], *, clone: Path, overrides: dict[str, str] | None = None
) -> list[Ran]:
    """Run the commands from ``clone`` (a copy of the repository's files the page names):
    ``cd`` and ``export`` change the directory and the environment of the commands after them,
    as in a shell, with ``overrides`` winning over the block's exports (a test's own database
    for a page's placeholder URL); every other line runs in bash. What each printed."""
    env, cwd, ran = reader_env(), clone, []
    for command in commands:
        words = shlex.split(command, comments=True)
        if words[0] == "cd":
            cwd = (cwd / words[1]).resolve()
            assert cwd.is_relative_to(clone.resolve()), f"{command} leaves the clone"
        elif words[0] == "export":
            for word in words[1:]:
                name, _, value = word.partition("=")
                env[name] = value
            env.update(overrides or {})
        else:
            done = subprocess.run(
                ["bash", "-c", command], cwd=cwd, env=env, text=True, capture_output=True,
                timeout=180,
            )  # fmt: skip
            ran.append(Ran(command, done.returncode, done.stdout, done.stderr))
    return ran
