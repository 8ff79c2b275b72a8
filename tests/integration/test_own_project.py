"""The own-project example (examples/own-project) runs as the quickstart says: its node
module registers its functions, and its workflow file completes on a real worker."""

from __future__ import annotations

import pytest

from conveyor.definition_files import load_definition
from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.migrations import ROOT
from conveyor.service import Conveyor
from tests.support.services import wait_for

EXAMPLE = ROOT / "examples" / "own-project"


def test_the_own_project_order_workflow_completes_with_its_total(
    conveyor_service: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import shop.nodes  # noqa: F401  (registers shop.price_order and shop.send_receipt)

    definition = load_definition(EXAMPLE / "workflows" / "order.yaml", max_bytes=1 << 20)
    conveyor_service.apply(parse_workflow(definition))

    lines = [{"quantity": 2, "unit_price": 9.5}, {"quantity": 1, "unit_price": 1}]
    execution_id = conveyor_service.trigger("order", {"email": "ada@example.com", "lines": lines})
    row = wait_for(conveyor_service, execution_id)

    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"total": 24.0, "sent_to": "ada@example.com"}
