"""A small client for applications: start an execution, wait for its result, read its status,
cancel it; :class:`Client` synchronous, :class:`AsyncClient` for ``async`` code.

Both call the service of this process (:func:`conveyor.wiring.service`), so they work the same
on the embedded default and in production. On the embedded default the workers run inside the
process that publishes, so use the client as a context manager there: it migrates the SQLite
database and runs worker threads until the ``with`` block ends::

    with conveyor.Client() as client:
        run = client.start(diamond, {"x": 3}, idempotency_key="order-7")
        result = client.wait(run, timeout=60)    # DiamondOutput: the flow's output type

A result is typed as the flow's output (a pydantic model is validated from the execution's
output; a TypedDict is the output as stored).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Self, TypedDict, overload

from pydantic import BaseModel
from typing_extensions import TypeVar, Unpack

from conveyor.engine.states import ExecutionStatus, Priority, TriggerSource
from conveyor.exceptions import ExecutionFailed, WaitTimeout
from conveyor.flows import Flow
from conveyor.store import DEFAULT_TENANT

if TYPE_CHECKING:
    from conveyor.service import Conveyor

In = TypeVar("In")
Out = TypeVar("Out", default=Any)

# Seconds between two reads of an execution a wait follows.
POLL_SECONDS = 0.2


class StartOptions(TypedDict, total=False):
    """What a start may say besides the workflow and its input."""

    idempotency_key: str  # a key the tenant used before returns that start's execution
    dedupe_key: str  # while an execution with it is active, the workflow's dedupe policy decides
    priority: Priority


@dataclass(frozen=True, kw_only=True)
class Sent:
    """What an event sent by :meth:`Client.send_event` did: the executions its subscriptions
    started, and the executions whose waits it woke."""

    started: list[uuid.UUID]
    woke: list[uuid.UUID]


@dataclass(frozen=True, kw_only=True)
class Execution(Generic[Out]):
    """An execution a client started: its id, and what its result is typed as."""

    id: uuid.UUID
    workflow: str
    replayed: bool = False  # an earlier start with the idempotency key made it
    dedupe: str | None = None  # what an active execution with the dedupe key did (see submit)
    output_type: type[Out] | None = None


class Client:
    """Start, wait for, read and cancel executions of one tenant."""

    def __init__(
        self,
        service: Conveyor | None = None,
        *,
        tenant: str = DEFAULT_TENANT,
        poll: float = POLL_SECONDS,
    ) -> None:
        self._service, self.tenant, self.poll = service, tenant, poll
        self._stack = ExitStack()

    @property
    def service(self) -> Conveyor:
        if self._service is None:
            from conveyor import wiring

            self._service = wiring.service()
        return self._service

    def __enter__(self) -> Self:
        """On the embedded default: migrate, and run worker threads until the block ends."""
        from conveyor import migrations, wiring
        from conveyor.config import get_settings

        if get_settings().embedded:
            from conveyor.embedded import embedded_workers

            wiring.load_imports()
            migrations.upgrade()
            self._stack.enter_context(embedded_workers())
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def apply(self, flow: Flow[Any, Any]) -> int:
        """Store the flow's definition if it changed; its version."""
        record, _ = self.service.apply(flow.definition(), self.tenant)
        return record.version

    @overload
    def start(
        self, workflow: Flow[In, Out], input: In, **options: Unpack[StartOptions]
    ) -> Execution[Out]: ...

    @overload
    def start(
        self, workflow: str, input: Any = None, **options: Unpack[StartOptions]
    ) -> Execution[Any]: ...

    def start(
        self, workflow: Flow[Any, Any] | str, input: Any = None, **options: Unpack[StartOptions]
    ) -> Execution[Any]:
        """Start an execution of the workflow (by its flow or its name, as applied). With an
        idempotency key the tenant used before, that start's execution is returned
        (``replayed``); with a dedupe key active on another, the workflow's dedupe policy
        decides (``dedupe``)."""
        name = workflow if isinstance(workflow, str) else workflow.name
        made = self.service.submit(
            name, input, tenant=self.tenant, source=TriggerSource.API, **options
        )
        output_type = None if isinstance(workflow, str) else workflow.output_type
        return Execution(id=made.execution_id, workflow=name, replayed=made.replayed,
                         dedupe=made.dedupe, output_type=output_type)  # fmt: skip

    def status(self, execution: Execution[Any] | uuid.UUID) -> ExecutionStatus:
        return self.service.execution_status(_id(execution), tenant=self.tenant)

    def wait(self, execution: Execution[Out], timeout: float | None = None) -> Out:
        """The execution's output once it completes; :class:`ExecutionFailed` if it fails or
        is cancelled, :class:`WaitTimeout` if it has not finished within ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (found := self.finished(execution)) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise _timed_out(execution, timeout)
            time.sleep(self.poll)
        return found

    def run(self, workflow: Flow[In, Out], input: In, *, timeout: float | None = None) -> Out:
        """Start an execution and wait for its output."""
        return self.wait(self.start(workflow, input), timeout)

    def finished(self, execution: Execution[Out]) -> Out | None:
        """The output if the execution completed, None while it runs; ExecutionFailed."""
        if not self.status(execution).finished:
            return None
        view = self._view(execution)  # the whole view once: its output, or its error
        status = ExecutionStatus(view["status"])
        if status is not ExecutionStatus.COMPLETED:
            raise ExecutionFailed(
                f"execution {execution.id} of {execution.workflow!r} is {status.value}: "
                f"{view['error'] or 'no error recorded'}; `conveyor executions show "
                f"{execution.id}` shows each node's",
                status=status.value,
            )
        return _typed(view["output"], execution.output_type)

    def cancel(self, execution: Execution[Any] | uuid.UUID) -> None:
        """Cancel the execution and its children (nothing for one already finished)."""
        self.service.cancel(_id(execution))

    def send_event(self, event: str, payload: Any = None, *, key: str | None = None) -> Sent:
        """Send an application event of this client's tenant: every wait node waiting for
        (``event``, ``key``) resumes with ``payload`` as its output (the event is kept for the
        waits that begin later), and every workflow subscribing to ``event`` starts."""
        delivered = self.service.send_event(event, payload, key=key, tenant=self.tenant)
        return Sent(
            started=[t.execution_id for t in delivered.started],
            woke=list(delivered.woke_executions),
        )

    def _view(self, execution: Execution[Any] | uuid.UUID) -> Any:
        return self.service.execution(_id(execution), tenant=self.tenant)


class AsyncClient:
    """:class:`Client` for ``async`` code: each call runs on a thread, a wait sleeps with
    asyncio between reads. ``async with`` runs the embedded workers as ``with`` does."""

    def __init__(self, client: Client | None = None) -> None:
        self.client = client or Client()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.client.__enter__)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.client.__exit__)

    async def apply(self, flow: Flow[Any, Any]) -> int:
        return await asyncio.to_thread(self.client.apply, flow)

    @overload
    async def start(
        self, workflow: Flow[In, Out], input: In, **options: Unpack[StartOptions]
    ) -> Execution[Out]: ...

    @overload
    async def start(
        self, workflow: str, input: Any = None, **options: Unpack[StartOptions]
    ) -> Execution[Any]: ...

    async def start(
        self, workflow: Flow[Any, Any] | str, input: Any = None, **options: Unpack[StartOptions]
    ) -> Execution[Any]:
        return await asyncio.to_thread(lambda: self.client.start(workflow, input, **options))

    async def status(self, execution: Execution[Any] | uuid.UUID) -> ExecutionStatus:
        return await asyncio.to_thread(self.client.status, execution)

    async def wait(
        self,
        execution: Execution[Out],
        timeout: float | None = None,  # noqa: ASYNC109 (Client.wait's; asyncio.timeout works too)
    ) -> Out:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (found := await asyncio.to_thread(self.client.finished, execution)) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise _timed_out(execution, timeout)
            await asyncio.sleep(self.client.poll)
        return found

    async def run(
        self,
        workflow: Flow[In, Out],
        input: In,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Out:
        return await self.wait(await self.start(workflow, input), timeout)

    async def cancel(self, execution: Execution[Any] | uuid.UUID) -> None:
        await asyncio.to_thread(self.client.cancel, execution)

    async def send_event(self, event: str, payload: Any = None, *, key: str | None = None) -> Sent:
        return await asyncio.to_thread(lambda: self.client.send_event(event, payload, key=key))


def _id(execution: Execution[Any] | uuid.UUID) -> uuid.UUID:
    return execution.id if isinstance(execution, Execution) else execution


def _timed_out(execution: Execution[Any], timeout: float | None) -> WaitTimeout:
    return WaitTimeout(
        f"execution {execution.id} of {execution.workflow!r} did not finish within "
        f"{timeout:g} s; it goes on running: wait again, or cancel it"
    )


def _typed(output: Any, output_type: type[Out] | None) -> Out:
    if isinstance(output_type, type) and issubclass(output_type, BaseModel):
        return output_type.model_validate(output)
    return output  # type: ignore[no-any-return]
