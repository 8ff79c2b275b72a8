"""examples/export-approval.yaml in Python: an export waits for a person's approval."""

from __future__ import annotations

from typing import TypedDict

import conveyor
from conveyor import demo


class Export(TypedDict):
    table: str
    rows: float


export_approval = conveyor.Flow(
    "export-approval",
    input=Export,
    description="Export a table once a person approves; tell the requester when rejected.",
)

# It holds no worker while it waits; its output is the decision (decision, by, at, comment).
# Nobody decides within a day (86400 s): the node fails, having no on_timeout branch.
approve = export_approval.approval(
    "approve", "Export the table to the partner's bucket?", within=86400
)
export = export_approval.call(
    demo.double,
    id="export",
    after=[approve.on_approve],
    inputs={"value": export_approval.input["rows"]},
)
notify = export_approval.call(
    demo.notify,
    id="notify",
    after=[approve.on_reject],
    inputs={"decision": {"approved": False, "by": "{{ nodes.approve.by }}"}},
)
export_approval.returns(
    {
        "decision": "{{ nodes.approve.decision }}",
        "exported": "{{ nodes.export.value if nodes.export else none }}",
    }
)
