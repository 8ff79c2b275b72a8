"""The documentation's links between its own pages lead somewhere: every relative link in
README.md, docs/ and examples/ names a file that exists and, when it has one, an anchor that
is a heading of that file (as GitHub makes anchors from headings)."""

from __future__ import annotations

import re
from pathlib import Path

from conveyor.migrations import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def pages() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *(ROOT / "examples").rglob("*.md"),
    ]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {anchor(h) for h in HEADING.findall(text)}


def test_anchors_are_made_as_github_makes_them() -> None:
    assert anchor("Why the p50 stays above 2 \u00d7") == "why-the-p50-stays-above-2-"
    assert anchor("Outbound HTTP: the `http` node") == "outbound-http-the-http-node"


def test_every_relative_link_in_the_docs_leads_to_a_file_and_heading_that_exist() -> None:
    broken = []
    for page in pages():
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"^[a-z]+:", target) or target == "#":
                continue
            path, _, fragment = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
