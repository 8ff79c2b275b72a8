"""The client's answers, on a service that only reads back the execution it is given: a typed
result, a failure with its error, a wait that times out (the real service and worker: in
tests/integration/test_flows.py and tests/acceptance/test_flows_embedded.py)."""

from __future__ import annotations

import uuid
from typing import Any, cast

import pytest
from pydantic import BaseModel

import conveyor
from conveyor.client import Execution
from conveyor.engine.states import ExecutionStatus
from conveyor.exceptions import ExecutionFailed, WaitTimeout
from conveyor.service import Conveyor


class Total(BaseModel):
    total: float


class Reads:
    """The two methods of the service a wait calls."""

    def __init__(self, status: str, output: Any = None, error: str | None = None) -> None:
        self.view = {"status": status, "output": output, "error": error}

    def execution_status(self, execution_id: uuid.UUID, *, tenant: str) -> ExecutionStatus:
        return ExecutionStatus(self.view["status"])

    def execution(self, execution_id: uuid.UUID, *, tenant: str) -> dict[str, Any]:
        return self.view


def client(status: str, output: Any = None, error: str | None = None) -> conveyor.Client:
    return conveyor.Client(cast(Conveyor, Reads(status, output, error)), poll=0.01)


def run_of(output_type: type[Any] | None = None) -> Execution[Any]:
    return Execution(id=uuid.uuid4(), workflow="sum", output_type=output_type)


def test_a_typed_flows_result_is_its_output_model() -> None:
    result = client("completed", {"total": 3}).wait(run_of(Total))

    assert result == Total(total=3.0)


def test_an_untyped_result_is_the_output_as_stored() -> None:
    assert client("completed", {"total": 3}).wait(run_of()) == {"total": 3}


def test_a_failed_execution_has_no_result_and_says_why() -> None:
    run = run_of()

    with pytest.raises(ExecutionFailed, match=f"execution {run.id} of 'sum' is failed: boom"):
        client("failed", error="boom").wait(run)


def test_a_wait_past_its_timeout_says_the_execution_goes_on() -> None:
    with pytest.raises(WaitTimeout, match="it goes on running"):
        client("running").wait(run_of(), timeout=0.05)
