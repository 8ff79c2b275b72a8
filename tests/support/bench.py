"""One store adapter under test, as the cases of tests/unit (in memory) and tests/contract
(in memory, SQLite, PostgreSQL) see it: its units of work, driven as the service drives them
(a claim and a lone success in autocommit, the rest in a transaction), a probe that reads its
rows, and the test's clock."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from conveyor.engine import claiming, failure, success, triggering
from conveyor.engine.records import Dispatch, NodeHints, WorkflowRecord
from conveyor.testing import (
    AttemptRow,
    Clock,
    DeliveryRow,
    ExecutionRow,
    InMemoryDatabase,
    JobRow,
    NodeStateRow,
    UnitOfWork,
    apply,
)


def node(node_id: str, *needs: str, type: str = "python", **fields: Any) -> dict[str, Any]:
    """A node's definition: a python step unless told otherwise."""
    config = {"function": "tests.step"} if type == "python" else {}
    return {"id": node_id, "type": type, "needs": list(needs), "config": config, **fields}


def condition(node_id: str, *needs: str, if_true: list[str], if_false: list[str]) -> dict[str, Any]:
    config = {"expression": "input.go", "if_true": if_true, "if_false": if_false}
    return node(node_id, *needs, type="condition", config=config)


@dataclass(frozen=True, kw_only=True)
class Rows:
    """Everything stored of one execution, to compare before and after."""

    execution: ExecutionRow
    nodes: dict[str, NodeStateRow]
    jobs: dict[str | None, JobRow]
    attempts: dict[uuid.UUID, list[AttemptRow]]


class Probe(Protocol):
    """Reads an adapter's rows, outside the port (what a test checks a transition did)."""

    def execution(self, execution_id: uuid.UUID) -> ExecutionRow: ...

    def nodes(self, execution_id: uuid.UUID) -> dict[str, NodeStateRow]: ...

    def jobs(self, execution_id: uuid.UUID) -> list[JobRow]: ...

    def job(self, job_id: uuid.UUID) -> JobRow: ...

    def delivery(self, delivery_id: uuid.UUID) -> DeliveryRow: ...

    def attempts(self, job_id: uuid.UUID) -> list[AttemptRow]: ...

    def counts(self) -> dict[str, int]:
        """How many executions, node states, jobs and attempts there are."""
        ...


class MemoryProbe:
    def __init__(self, db: InMemoryDatabase) -> None:
        self.tables = db.tables

    def execution(self, execution_id: uuid.UUID) -> ExecutionRow:
        return self.tables.executions[execution_id]

    def nodes(self, execution_id: uuid.UUID) -> dict[str, NodeStateRow]:
        found = self.tables.node_states.values()
        return {n.node_id: n for n in found if n.execution_id == execution_id}

    def jobs(self, execution_id: uuid.UUID) -> list[JobRow]:
        return [j for j in self.tables.jobs.values() if j.execution_id == execution_id]

    def job(self, job_id: uuid.UUID) -> JobRow:
        return self.tables.jobs[job_id]

    def delivery(self, delivery_id: uuid.UUID) -> DeliveryRow:
        return self.tables.deliveries[delivery_id]

    def attempts(self, job_id: uuid.UUID) -> list[AttemptRow]:
        return sorted(
            (a for a in self.tables.attempts.values() if a.job_id == job_id),
            key=lambda a: a.attempt_number,
        )

    def counts(self) -> dict[str, int]:
        t = self.tables
        return {"executions": len(t.executions), "node_states": len(t.node_states),
                "jobs": len(t.jobs), "job_attempts": len(t.attempts)}  # fmt: skip


@dataclass
class Bench:
    """An adapter (``kind``: memory, sqlite or postgres) and the verbs of the cases."""

    kind: str
    units: UnitOfWork
    probe: Probe
    clock: Clock

    def store(self) -> Any:
        """A unit of work's store, for a case that calls the port itself."""
        return self.units.transaction()

    def apply(self, name: str, *nodes: dict[str, Any], tenant: str = "default",
              **extra: Any) -> WorkflowRecord:  # fmt: skip
        return apply(self.units, {"name": name, "nodes": list(nodes), **extra}, self.clock(),
                     tenant=tenant)  # fmt: skip

    def trigger(
        self, name: str, input: Any = None, *, tenant: str = "default", **keys: Any
    ) -> triggering.Triggered:
        """As the service starts one: its writes are single statements (autocommit)."""
        return self.units.autocommit(
            lambda s: triggering.trigger(
                s, workflow_name=name, tenant=tenant, input=input if input is not None else {},
                now=self.clock(), **keys,
            )
        )  # fmt: skip

    def claim(self, job_id: uuid.UUID, hints: NodeHints | None = None) -> claiming.NodeRun | None:
        return self.units.autocommit(
            lambda s: claiming.claim_node(s, job_id, self.clock(), "tester", hints)
        )

    def claimed(self, job_id: uuid.UUID, hints: NodeHints | None = None) -> claiming.NodeRun:
        run = self.claim(job_id, hints)
        assert run is not None, f"job {job_id} was not claimed"
        return run

    def job(self, execution_id: uuid.UUID, node_id: str | None) -> JobRow:
        """The job of a node (None: the execution's start job)."""
        (found,) = [j for j in self.probe.jobs(execution_id) if j.node_id == node_id]
        return found

    def jobs(self, execution_id: uuid.UUID) -> dict[str | None, JobRow]:
        """The execution's jobs by node (None: its start job)."""
        return {j.node_id: j for j in self.probe.jobs(execution_id)}

    def claim_node(self, execution_id: uuid.UUID, node_id: str) -> claiming.NodeRun:
        return self.claimed(self.job(execution_id, node_id).id)

    def alone(self, run: claiming.NodeRun, output: Any) -> bool:
        return self.units.autocommit(
            lambda s: success.complete_alone(s, run, output, self.clock(), 0.01)
        )

    def complete(self, run: claiming.NodeRun, output: Any) -> list[Dispatch]:
        return self.units.run(
            lambda s: success.complete_node(s, run, output, self.clock(), 0.01)
        ).dispatches

    def succeed(self, run: claiming.NodeRun, output: Any) -> list[Dispatch]:
        """As the service records a success: alone when it can, else the transaction."""
        if self.alone(run, output):
            return []
        return self.complete(run, output)

    def fail(self, run: claiming.NodeRun, error: BaseException) -> failure.Failed:
        return self.units.run(
            lambda s: failure.fail_node(s, run, error, self.clock(), 0.01, random.Random(7))
        )

    def rows(self, execution_id: uuid.UUID) -> Rows:
        jobs = self.jobs(execution_id)
        return Rows(
            execution=self.probe.execution(execution_id),
            nodes=self.probe.nodes(execution_id),
            jobs=jobs,
            attempts={j.id: self.probe.attempts(j.id) for j in jobs.values()},
        )

    def statuses(self, execution_id: uuid.UUID) -> dict[str, str]:
        """Each node's status, as text (short to compare)."""
        return {n: row.status.value for n, row in self.probe.nodes(execution_id).items()}


def memory_bench() -> Bench:
    db = InMemoryDatabase()
    return Bench(kind="memory", units=db, probe=MemoryProbe(db), clock=Clock())


@contextmanager
def fresh_engine_memory() -> Iterator[None]:
    """The engine's memory of each (tenant, workflow)'s latest version forgotten around a
    test: a test's database is new, and a version remembered from another test's would be
    taken for stale and read again, or (once the parsed versions' cache let it go) not found."""
    saved = triggering._targets
    triggering._targets = triggering._Targets()
    try:
        yield
    finally:
        triggering._targets = saved
