"""A workflow's DAG laid out for drawing as SVG: pure, from the definition's nodes alone.

Each node sits in the column of its longest path from a root (so every edge points right),
rows in the definition's order within a column; edges join a node's right side to its
successor's left side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WIDTH, HEIGHT = 150, 44  # a node's box
GAP_X, GAP_Y, MARGIN = 60, 24, 12


@dataclass(frozen=True, kw_only=True)
class Box:
    id: str
    type: str
    x: int
    y: int


@dataclass(frozen=True, kw_only=True)
class Edge:
    source: str
    target: str
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True, kw_only=True)
class Layout:
    boxes: list[Box]
    edges: list[Edge]
    width: int
    height: int
    box_width: int = WIDTH
    box_height: int = HEIGHT


def layout(nodes: Sequence[Mapping[str, Any]]) -> Layout:
    """Columns by longest path from a root; ``nodes`` as a definition lists them (``id``,
    ``type``, ``needs``). A ``needs`` naming no node is left out (validation refuses it)."""
    needs = {str(n["id"]): [str(p) for p in n.get("needs") or []] for n in nodes}
    column: dict[str, int] = {}

    def depth(node_id: str, seen: frozenset[str] = frozenset()) -> int:
        if node_id not in column:
            parents = [p for p in needs.get(node_id, []) if p in needs and p not in seen]
            column[node_id] = 1 + max((depth(p, seen | {node_id}) for p in parents), default=-1)
        return column[node_id]

    rows: dict[int, int] = {}
    boxes: dict[str, Box] = {}
    for node in nodes:
        node_id = str(node["id"])
        col = depth(node_id)
        row = rows.get(col, 0)
        rows[col] = row + 1
        boxes[node_id] = Box(
            id=node_id,
            type=str(node.get("type", "")),
            x=MARGIN + col * (WIDTH + GAP_X),
            y=MARGIN + row * (HEIGHT + GAP_Y),
        )
    edges = [
        Edge(source=p, target=t, x1=boxes[p].x + WIDTH, y1=boxes[p].y + HEIGHT // 2,
             x2=boxes[t].x, y2=boxes[t].y + HEIGHT // 2)
        for t, parents in needs.items() for p in parents if p in boxes
    ]  # fmt: skip
    columns = max(column.values(), default=0) + 1
    most_rows = max(rows.values(), default=1)
    return Layout(
        boxes=list(boxes.values()),
        edges=edges,
        width=2 * MARGIN + columns * WIDTH + (columns - 1) * GAP_X,
        height=2 * MARGIN + most_rows * HEIGHT + (most_rows - 1) * GAP_Y,
    )
