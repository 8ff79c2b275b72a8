"""The narrow ports the engine talks through: the :class:`Store` (PostgreSQL and SQLite in
:mod:`conveyor.store`), the :class:`Dispatcher` (:mod:`conveyor.tasks.dispatch`), the
:class:`Limiter` (:mod:`conveyor.limiter`) and the :class:`BrokerQueues`
(:mod:`conveyor.brokers`). Nothing under :mod:`conveyor.engine` imports an
adapter: the engine's decisions call these and nothing else."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from conveyor.engine.limits import Acquired, KeyUsage, Permit, PermitRequest, SweepReport, Wake
from conveyor.engine.records import (
    Advance,
    Created,
    DeliveryReceipt,
    DeliveryRecord,
    Dispatch,
    EndpointRecord,
    EventRecord,
    ExecutionOutcome,
    ExecutionRecord,
    Finish,
    Fire,
    FollowUp,
    ItemRow,
    ItemsLeft,
    JobRecord,
    NewItem,
    NewJob,
    NodeRow,
    ScheduleRecord,
    Stepped,
    Succeeded,
    TraceContext,
    WaitRecord,
    WorkflowRecord,
)
from conveyor.engine.states import (
    AttemptStatus,
    DeliveryStatus,
    ExecutionStatus,
    JobKind,
    JobStatus,
    NodeStatus,
    Priority,
    SubscriptionKind,
)


class Dispatcher(Protocol):
    """Publishes job ids to the broker. Called only after the transaction has committed.
    ``batch``: node jobs may share a message (see :mod:`conveyor.engine.packing`); False
    sends each in a message of its own (a batch's hand-back)."""

    def publish(self, dispatches: Sequence[Dispatch], *, batch: bool = True) -> None: ...


class Limiter(Protocol):
    """Concurrency permits for node jobs (see :mod:`conveyor.engine.limits`).

    Every call is atomic. A call that frees or finds room wakes parked jobs and returns them;
    the caller publishes them. Adapter: :class:`conveyor.limiter.RedisLimiter`.
    """

    def acquire(self, request: PermitRequest) -> Acquired:
        """All three permits, or none and the job parked (a parked job asking again, as a
        duplicate message would, stays parked once)."""
        ...

    def release(self, permit: Permit) -> list[Wake]:
        """Give the permits back and wake whoever can run now."""
        ...

    def renew(self, permits: Sequence[Permit]) -> list[str]:
        """Extend the leases (the heartbeat); returns the tokens whose lease had lapsed."""
        ...

    def sweep(self, age_after: float) -> SweepReport:
        """The safety net: take back lapsed leases and grants, age low jobs, wake who fits."""
        ...

    def forget(self, job_ids: Sequence[uuid.UUID]) -> list[Wake]:
        """Jobs that will never run (cancelled) leave the lines and give back any grant."""
        ...

    def known(self, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
        """For each job: 'parked', 'granted' or '' when the limiter does not know it."""
        ...

    def snapshot(self) -> list[KeyUsage]:
        """Every key with its permits in use, its limit and the jobs waiting under it."""
        ...


class BrokerQueues(Protocol):
    """What the broker holds: its messages waiting per (queue, priority label), ready for a
    consumer (those a consumer has reserved and not yet acknowledged are left out). The
    priority label is the job's priority where the broker keeps one line per priority (Redis:
    ``high``, ``normal``, ``low``), ``all`` where one queue holds every priority (RabbitMQ).
    A queue the broker does not have holds 0. Adapters: :mod:`conveyor.brokers`; the
    recovery sweep's decision on them is :func:`conveyor.engine.queues.may_hold`."""

    def depth(self) -> dict[tuple[str, str], int]: ...


# -- the store ---------------------------------------------------------------------------------
#
# Every method runs in the caller's unit of work (the store never commits) and changes state
# only from the status it expects, so a message delivered twice, or two workers racing,
# change nothing twice. The adapters (conveyor.store: PostgresStore, SqliteStore) implement
# each method once; the contract tests (tests/contract) hold both to the same cases.


class Catalog(Protocol):
    """Tenants and the stored versions of their workflows."""

    def tenant_id(self, name: str) -> uuid.UUID:
        """The tenant's id; :class:`TenantNotFound` when it has none."""
        ...

    def tenant_named(self, name: str) -> uuid.UUID | None:
        """The tenant's id; None when there is none (nothing is made, the default tenant
        neither: a read by name, as an operator's view of another tenant asks)."""
        ...

    def trigger_target(self, tenant: str, workflow: str) -> tuple[uuid.UUID, uuid.UUID | None]:
        """The tenant's id and its latest version of ``workflow`` (None: none), in one read."""
        ...

    def workflow(self, workflow_id: uuid.UUID) -> WorkflowRecord: ...

    def workflow_version(
        self, tenant_id: uuid.UUID, name: str, version: int
    ) -> WorkflowRecord | None:
        """The tenant's ``version`` of workflow ``name``; None when it has no such version."""
        ...

    def latest_workflow(self, tenant_id: uuid.UUID, name: str) -> WorkflowRecord | None: ...

    def latest_workflows(
        self, keys: Collection[tuple[uuid.UUID, str]]
    ) -> dict[tuple[uuid.UUID, str], WorkflowRecord]:
        """The latest version of each (tenant, workflow name) that has one."""
        ...

    def add_workflow_version(
        self,
        tenant_id: uuid.UUID,
        name: str,
        digest: str,
        definition: dict[str, Any],
        now: datetime,
    ) -> WorkflowRecord: ...

    def lock_applies(self, tenant_id: uuid.UUID) -> None:
        """Hold, until the caller's transaction ends, the tenant's lock of applies that
        start children: two applies that each close half a circle of workflows take turns,
        the second checking what the first stored (PostgreSQL: a transaction-level advisory
        lock; SQLite's and the memory store's transactions are one writer at a time already)."""
        ...


class Executions(Protocol):
    """Executions: made by a trigger, started by a plan, settled node by node, finished."""

    def create_execution(
        self,
        execution: ExecutionRecord,
        *,
        names: tuple[str, str] | None,
        trigger: str,
        now: datetime,
        idempotency_key: str | None = None,
        dedupe_key: str | None = None,
        waiting_on: Mapping[str, int] | None = None,
        queued: Collection[str] = (),
        jobs: Sequence[NewJob] = (),
        start_job: uuid.UUID | None = None,
    ) -> Created:
        """The trigger: the execution, and when it is planned at once (``waiting_on``: each
        node's count of needs) its node states (``queued`` queued, the rest pending) and first
        ``jobs``, or else its ``start_job``. Nothing is stored when ``names`` (tenant,
        workflow) no longer name the execution's version as the latest (STALE; None: a
        version the caller read in this unit of work, a child's, is not checked), or when its
        idempotency key, the deduplication key of an active execution, or (a child:
        ``execution.parent``) its parent job's try, is taken (KEY_TAKEN). Needs no
        transaction around it."""
        ...

    def execution(self, execution_id: uuid.UUID) -> ExecutionRecord:
        """The execution; :class:`ExecutionNotFound` when there is none."""
        ...

    def execution_status(
        self, execution_id: uuid.UUID, *, lock: bool = False
    ) -> ExecutionStatus | None:
        """The status (None: no such execution); with ``lock``, read under the row lock."""
        ...

    def execution_by_key(self, tenant_id: uuid.UUID, key: str) -> tuple[uuid.UUID, str] | None:
        """The execution an idempotency key made, with its workflow's name."""
        ...

    def active_by_dedupe(self, tenant_id: uuid.UUID, key: str) -> tuple[uuid.UUID, str] | None:
        """The pending or running execution with this deduplication key, and its workflow."""
        ...

    def replace_unstarted_input(self, execution_id: uuid.UUID, input: Any) -> bool:
        """Replace the input of a pending execution whose start job is not claimed yet (no
        node has run), a claim racing it waiting for it; False, changing nothing, when it has
        started or finished."""
        ...

    def leave_follow_up(self, execution_id: uuid.UUID, input: Any, now: datetime) -> bool:
        """Store ``input`` as the follow-up of a pending or running execution, left at
        ``now`` (:meth:`FollowUp.stored`, replacing a follow-up left before); False, changing
        nothing, when it has finished."""
        ...

    def take_follow_up(self, execution_id: uuid.UUID) -> FollowUp | None:
        """The follow-up left on the execution, cleared (taken once); None: none."""
        ...

    def start_execution(self, execution_id: uuid.UUID, node_count: int, now: datetime) -> bool:
        """The plan: pending -> running with ``node_count`` nodes to settle."""
        ...

    def settle_nodes(
        self, execution_id: uuid.UUID, count: int, finish: Finish | None = None
    ) -> int | None:
        """``count`` more nodes settled; how many are left (None: not running any more).
        With ``finish``, completes the execution when none is left. Locks the row: last."""
        ...

    def finish_execution(
        self,
        execution_id: uuid.UUID,
        status: ExecutionStatus,
        now: datetime,
        *,
        output: Any = None,
        error: str | None = None,
    ) -> bool:
        """pending or running -> ``status``; False when it had finished already."""
        ...

    def cancel_unstarted(self, execution_id: uuid.UUID, now: datetime) -> list[uuid.UUID]:
        """Cancel the jobs and nodes that have not started (jobs queued, parked, held or
        waiting for their time, and those waiting for a child, the try each waits in ended
        ``cancelled``: the caller stops the children; nodes pending, queued or waiting, and
        the map nodes whose items run); the node jobs among them that the limiter may know
        (not the held items). It takes a share of the execution's row lock first, one that
        waits for, and holds back, a transaction that read the status under the row lock
        (:meth:`execution_status`), so that a stop comes wholly before or after one."""
        ...

    def execution_outcome(self, execution_id: uuid.UUID) -> ExecutionOutcome | None:
        """Its status, output, error and first dead letter (None: no such execution)."""
        ...

    def children_started(self, execution_id: uuid.UUID, most: int) -> int:
        """How many children the execution has started, whatever became of them, counted up
        to ``most`` (a count of ``most`` means at least that many)."""
        ...

    def active_children(
        self, execution_id: uuid.UUID, node_id: str | None = None
    ) -> list[uuid.UUID]:
        """Its children still pending or running, oldest first; with ``node_id``, only those
        that node started (a map of children's)."""
        ...

    def orphaned_children(self, limit: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
        """Children still pending or running that their parent's node no longer waits for
        (its job does not wait for them in the try that started them: a stop cancelled it,
        and left them to a later transaction), oldest first, with their parents' ids; those
        another transaction has locked are skipped."""
        ...

    def children_to_settle(self, limit: int) -> list[uuid.UUID]:
        """Finished children whose parent's job still waits for them in the try that started
        them: a wait their finish left unsettled (none should be), oldest first."""
        ...


class NodeStates(Protocol):
    """A node's state in an execution: its status, output and count of needs unsettled."""

    def add_node_states(
        self,
        execution_id: uuid.UUID,
        waiting_on: Mapping[str, int],
        queued: Collection[str] = (),
    ) -> None: ...

    def set_node(
        self, execution_id: uuid.UUID, node_id: str, status: NodeStatus, **values: Any
    ) -> None:
        """Set a node's status, and ``values`` among output, branch, error, finished_at."""
        ...

    def decrement_waiting(self, execution_id: uuid.UUID, node_ids: Sequence[str]) -> dict[str, int]:
        """One more need of each node settled (rows locked in the given order: callers
        sort); how many each still waits on. Makes a join start exactly once."""
        ...

    def queue_nodes(self, execution_id: uuid.UUID, node_ids: Sequence[str]) -> None:
        """pending -> queued, for nodes whose jobs were just added."""
        ...

    def node_rows(
        self, execution_id: uuid.UUID, node_ids: Iterable[str], *, outputs: bool = True
    ) -> dict[str, NodeRow]:
        """The states of some nodes; without ``outputs``, their outputs left out."""
        ...


class Jobs(Protocol):
    """Jobs and their tries: claimed, recorded, retried, promoted when due."""

    def add_node_jobs(
        self, execution: ExecutionRecord, jobs: Sequence[NewJob], now: datetime
    ) -> None:
        """Node jobs, queued (or held until their ``next_run_at``)."""
        ...

    def claim_job(self, job_id: uuid.UUID, kind: JobKind, now: datetime) -> JobRecord | None:
        """queued or parked -> processing; None when it is not a runnable job of that kind."""
        ...

    def claim_node_job(
        self,
        job_id: uuid.UUID,
        now: datetime,
        worker: str | None,
        needs: Sequence[str] = (),
        input: bool = True,
    ) -> tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None:
        """The claim of a node: the job (queued or parked -> processing) with its execution
        and, unless the execution has finished, its try started (an attempt row), its node
        running and, with ``needs``, their outputs (the third item; None without needs or
        when the execution has finished). With ``input`` False the execution's input is not
        read: the record's is None. None when the job is not a runnable node job.
        Needs no transaction around it."""
        ...

    def claim_continuation(
        self,
        job_id: uuid.UUID,
        now: datetime,
        worker: str | None,
        *,
        queue: str,
        priority: Priority,
        needs: Sequence[str] = (),
        input: bool = True,
    ) -> tuple[JobRecord, ExecutionRecord, dict[str, Any] | None] | None:
        """The claim of a chain's next node by the worker whose success just made it ready,
        inside that success's transaction (no message, no broker hop): as
        :meth:`claim_node_job`, but only while no node job of a priority higher than
        ``priority`` is queued in ``queue`` (those go first: the worker returns to the
        broker). None, and nothing changed, when one is, or when the job is not runnable."""
        ...

    def complete_running(
        self,
        job: JobRecord,
        node_id: str,
        *,
        output: Any,
        branch: str | None,
        now: datetime,
        duration: float,
        successors: Sequence[str] | None = None,
        finish: Finish | None = None,
    ) -> bool:
        """A node's success while its job is processing in this try and its execution
        runs: job completed, attempt succeeded, node completed with ``output``. False, and
        nothing changed, otherwise.

        With ``successors`` (those of the node), the node's whole success, only when it
        makes none of them ready (else False, nothing changed): each one need fewer, the
        node settled and, with ``finish``, the execution completed if it was the last.
        Needs no transaction around it."""
        ...

    def complete_step(
        self,
        succeeded: Succeeded,
        successor: NewJob,
        *,
        worker: str | None,
        claim: bool,
    ) -> Stepped | None:
        """A chain's step, when the node's success makes exactly its one successor ready:
        ``successor.node_id``'s state pending and waiting on this node alone, the job
        processing in this try, the execution running. Then, in one unit: the node's success
        (as :meth:`complete_running`), the execution one node fewer, the successor's need
        counted, its job ``successor`` inserted and, with ``claim`` and while no node job of
        a priority higher than the execution's is queued in the node queue, claimed for
        ``worker`` (as :meth:`claim_continuation`, the outputs of its needs read); else
        queued, its node queued, for its message to be published. None, and nothing
        changed, in every other case: the caller takes the transaction
        (:func:`~conveyor.engine.success.complete_node`). Needs no transaction around it."""
        ...

    def resume_waiting(
        self, job_id: uuid.UUID, try_number: int, waiting: JobStatus = JobStatus.WAITING_CHILD
    ) -> JobRecord | None:
        """``waiting`` (waiting_child, or waiting_event) -> processing while try
        ``try_number`` is current: the try that started a child (or waits for an event), its
        outcome to be recorded next in the same transaction. None, and nothing changed, when
        the job does not wait (settled already, or another try's)."""
        ...

    def add_attempt(self, job: JobRecord, worker: str | None, now: datetime) -> None:
        """The row of the try a claim of ``job`` starts."""
        ...

    def finish_attempt(
        self,
        job_id: uuid.UUID,
        number: int,
        status: AttemptStatus,
        now: datetime,
        duration: float,
        *,
        error: str | None = None,
        timed_out: bool = False,
        traceback: str | None = None,
    ) -> None:
        """Settle try ``number`` of a job: its status, when it ended, its error and (a failed
        try's) traceback."""
        ...

    def transition_job(
        self,
        job_id: uuid.UUID,
        expected: JobStatus,
        new: JobStatus,
        *,
        try_number: int | None = None,
        **values: Any,
    ) -> bool:
        """``expected`` -> ``new`` (with ``try_number``: only while that try is current)."""
        ...

    def schedule_retry(
        self, job_id: uuid.UUID, next_run_at: datetime, error: str, *, try_number: int
    ) -> bool:
        """processing -> retry_wait while try ``try_number`` is current."""
        ...

    def schedule_snooze(self, job_id: uuid.UUID, next_run_at: datetime, *, try_number: int) -> bool:
        """processing -> retry_wait while try ``try_number`` is current, no attempt spent:
        the next try is the job's next try number, its attempt (``retry_count``) the same."""
        ...

    def snoozes_in_a_row(self, job_id: uuid.UUID, try_number: int) -> int:
        """How many of the job's tries just before try ``try_number`` snoozed."""
        ...

    def promote_due(self, now: datetime, limit: int) -> list[JobRecord]:
        """Waiting jobs whose time has come -> queued (rows another promoter holds skipped)."""
        ...

    def age_queued(self, cutoff: datetime, limit: int) -> list[JobRecord]:
        """Low jobs queued since before ``cutoff`` -> normal."""
        ...


class MapItems(Protocol):
    """A map node's items (conveyor.engine.mapping): item jobs, counted down on the node's
    state under its row lock, each settle releasing the held item its item's job names."""

    def add_item_jobs(
        self,
        execution: ExecutionRecord,
        node_id: str,
        items: Sequence[NewItem],
        max_retries: int,
        now: datetime,
    ) -> None:
        """Item jobs of the map node ``node_id``: queued, or held (no message) for those the
        window has no room for yet, each naming the held item it releases (``releases``).
        Callers insert a long list in chunks."""
        ...

    def open_map(self, execution_id: uuid.UUID, node_id: str, total: int) -> None:
        """The map node's counter: ``total`` items, none settled, none failed."""
        ...

    def complete_item(self, job: JobRecord, output: Any, now: datetime, duration: float) -> bool:
        """An item's success while its job is processing in this try and its execution runs:
        job completed with ``output``, attempt succeeded. False, nothing changed, otherwise.
        The map's counter is :meth:`settle_item`'s."""
        ...

    def complete_item_alone(
        self, job: JobRecord, node_id: str, output: Any, now: datetime, duration: float
    ) -> ItemsLeft | None:
        """An item's whole success when it is not its map's last: :meth:`complete_item`
        and :meth:`settle_item` at once, the node state's row locked first. None, nothing
        changed, when it may be the last (or its node or execution does not run, or its try
        is not current): the caller takes the transaction. Needs no transaction around it."""
        ...

    def settle_item(
        self, job: JobRecord, node_id: str, failed: bool, now: datetime
    ) -> ItemsLeft | None:
        """The item ``job`` of the map settled (``failed``: dead): the map counted down under
        the node state's row lock, while the node runs, and the held item ``job`` names
        (:attr:`NewItem.releases`) released (queued), found by the map's key. None, nothing
        changed, when the node does not run any more (it failed fast)."""
        ...

    def map_runs(self, execution_id: uuid.UUID, node_id: str) -> bool:
        """Whether the map node still runs, so that its items may try again: read under a
        share of the node state's row lock, so that a :meth:`close_map` comes wholly before
        this transaction (False) or after it (and then cancels the retry it schedules)."""
        ...

    def close_map(
        self, execution_id: uuid.UUID, node_id: str, now: datetime, error: str
    ) -> list[uuid.UUID] | None:
        """The map node running -> failed with ``error`` (once: None when it was not running),
        its items not started cancelled; those the limiter may know (queued or parked)."""
        ...

    def item_outputs(self, execution_id: uuid.UUID, node_id: str) -> list[ItemRow]:
        """Every item of the map, in index order, with its status, output and last error
        (those of its list only: below its node's ``items_total``, not an earlier run's)."""
        ...

    def renew_items(
        self,
        execution: ExecutionRecord,
        node_id: str,
        items: Sequence[NewItem],
        max_retries: int,
        now: datetime,
    ) -> dict[int, uuid.UUID]:
        """A re-run map opened again: each of ``items`` (a chunk of consecutive indices) whose
        index has a job from an earlier run takes that job, as :meth:`add_item_jobs` would
        make it (its item, queued or held, its output and error cleared), with a fresh set
        of tries numbered on after the ones it made (their rows stay). Those jobs' ids by
        index; the other items are for :meth:`add_item_jobs`."""
        ...

    def retire_items(
        self, execution_id: uuid.UUID, node_id: str, total: int, now: datetime, error: str
    ) -> None:
        """The jobs of a re-run map's items at index ``total`` and past (an earlier run's
        list was longer) -> cancelled with ``error``; no read of the map's items counts them
        again."""
        ...

    def items_size(self, execution_id: uuid.UUID, node_id: str) -> int:
        """The length of the map's output as JSON text, measured where the items are
        stored, none of them read: the list of its items' outputs, a failed item's slot
        ``{"error": ...}`` (:meth:`item_outputs` makes it), with its brackets and
        separators. In characters, as the database writes JSON (PostgreSQL: jsonb's text, a
        character that ``json.dumps`` escapes counted once)."""
        ...


class DeadLetters(Protocol):
    """Node jobs that exhausted their tries: requeued (the execution resumes) or discarded."""

    def dead_letter(self, job_id: uuid.UUID, tenant_id: uuid.UUID | None) -> JobRecord | None:
        """A dead-lettered or discarded node job, locked; None when none (of that tenant)."""
        ...

    def has_discarded(self, execution_id: uuid.UUID) -> bool: ...

    def revive_execution(
        self,
        execution_id: uuid.UUID,
        finished: Collection[ExecutionStatus] = (ExecutionStatus.FAILED,),
    ) -> bool:
        """One of the ``finished`` statuses (a requeue's: failed) -> running, its output,
        error and end cleared; False when it has none of them. :class:`DuplicateExecution`
        when its deduplication key is active on another execution now (nothing changed)."""
        ...

    def revive_jobs(
        self, execution_id: uuid.UUID, now: datetime, keep: Collection[str]
    ) -> list[JobRecord]:
        """The jobs the failure stopped get fresh tries (not those of nodes in ``keep``)."""
        ...

    def revive_nodes(
        self, execution_id: uuid.UUID, queued: Collection[str], keep: Collection[str]
    ) -> None: ...

    def recount(self, execution_id: uuid.UUID, waiting_on: dict[str, int], remaining: int) -> None:
        """The counters a resumed execution goes on with."""
        ...

    def discard_dead_letter(self, job_id: uuid.UUID, now: datetime) -> bool: ...


class Reruns(Protocol):
    """An operator's rerun of a finished execution from a node (:mod:`conveyor.engine.reruns`):
    recorded, its nodes' jobs held until they are ready, the input it gave read at claim."""

    def dedupe_holder(self, execution_id: uuid.UUID) -> uuid.UUID | None:
        """Another pending or running execution of its tenant with its deduplication key
        (None: none, or it has no key)."""
        ...

    def add_rerun(
        self,
        execution_id: uuid.UUID,
        from_node: str,
        input: dict[str, Any] | None,
        requested_by: str,
        now: datetime,
    ) -> None:
        """Record the rerun (who asked, when, the input given to ``from_node``) and count it
        on the execution (``ExecutionRecord.reruns``)."""
        ...

    def rerun_input(self, execution_id: uuid.UUID, node_id: str) -> dict[str, Any] | None:
        """The input the execution's latest rerun gave ``node_id`` in place of its rendered
        inputs; None when that rerun was from another node, or gave none."""
        ...

    def hold_jobs(self, execution_id: uuid.UUID, node_ids: Collection[str]) -> None:
        """The node jobs of ``node_ids`` (a map's items too) that are not in flight
        (completed, dead-lettered, discarded, cancelled or held) -> held, with a fresh set of
        tries numbered on after the ones they made (their attempt rows stay) and their last
        error and an item's output cleared."""
        ...

    def reset_nodes(self, execution_id: uuid.UUID, node_ids: Collection[str]) -> None:
        """Nodes that run again -> pending, their output, branch, error, times and a map's
        counter cleared (the caller recounts what they wait on)."""
        ...

    def items_in_flight(self, execution_id: uuid.UUID, node_ids: Collection[str]) -> list[str]:
        """The nodes among ``node_ids`` with a map item not settled (queued, parked,
        processing, waiting for a child or for its retry): a try begun before the execution
        ended, or one to come. Sorted."""
        ...

    def take_held_jobs(
        self, execution: ExecutionRecord, jobs: Sequence[NewJob], now: datetime
    ) -> dict[str, uuid.UUID]:
        """For each new job whose node has a held job: that job instead, held -> queued (or
        scheduled at the new one's ``next_run_at``) with its ``max_retries`` and the
        execution's priority. The ids of the jobs taken, by node; the other new jobs are for
        :meth:`Jobs.add_node_jobs`."""
        ...


class Deliveries(Protocol):
    """Webhook endpoints, their verified deliveries, and the subscriptions they start."""

    def endpoints(self, tenant_id: uuid.UUID) -> list[EndpointRecord]: ...

    def note_signature(
        self, endpoint_id: uuid.UUID, digest: str, now: datetime, window: timedelta
    ) -> bool:
        """False when the endpoint received this signature less than ``window`` ago."""
        ...

    def add_delivery(
        self,
        endpoint: EndpointRecord,
        delivery_id: str,
        event: str | None,
        payload: Any,
        now: datetime,
        trace: TraceContext | None = None,
    ) -> uuid.UUID | None:
        """A verified delivery stored (with the trace context where it was received); None
        when the endpoint has one with that id."""
        ...

    def stored_delivery(self, endpoint_id: uuid.UUID, delivery_id: str) -> DeliveryReceipt | None:
        """The delivery the endpoint stored under the sender's ``delivery_id``, as a repeat
        of it is answered (``repeated``); None when there is none."""
        ...

    def claim_delivery(self, delivery_id: uuid.UUID) -> DeliveryRecord | None:
        """Lock a delivery still waiting; None once it was handled."""
        ...

    def finish_delivery(
        self,
        delivery_id: uuid.UUID,
        status: DeliveryStatus,
        executions: Sequence[uuid.UUID],
        now: datetime,
    ) -> None:
        """Mark a claimed delivery handled, with the executions it started."""
        ...

    def replace_subscriptions(
        self,
        tenant_id: uuid.UUID,
        workflow_name: str,
        rows: Sequence[tuple[SubscriptionKind, str, list[str]]],
    ) -> None: ...

    def subscribers(
        self, tenant_id: uuid.UUID, kind: SubscriptionKind, source: str
    ) -> list[tuple[str, list[str]]]:
        """(workflow name, event filter) of every subscription to ``source``."""
        ...


class Schedules(Protocol):
    """Cron schedules and the runs they fire."""

    def add_schedule(self, **values: Any) -> ScheduleRecord:
        """:class:`ScheduleError` when the tenant already has the name."""
        ...

    def schedule(self, tenant_id: uuid.UUID, name: str) -> ScheduleRecord | None: ...

    def schedules(
        self, tenant_id: uuid.UUID | None, *, workflow: str | None = None
    ) -> list[ScheduleRecord]: ...

    def update_schedule(self, schedule_id: uuid.UUID, now: datetime, **values: Any) -> None: ...

    def delete_schedules(self, ids: Collection[uuid.UUID]) -> None: ...

    def claim_due_schedules(self, now: datetime, limit: int) -> list[ScheduleRecord]:
        """Lock enabled schedules whose slot has come (those another check holds skipped)."""
        ...

    def add_fired_executions(
        self, fires: Sequence[Fire], now: datetime
    ) -> list[tuple[Fire, uuid.UUID]]:
        """Each new fire's execution and start job (a fire stored already is left alone)."""
        ...

    def advance_schedules(self, advances: Sequence[Advance], now: datetime) -> None: ...


class Waits(Protocol):
    """Wait nodes and the application events that wake them (:mod:`conveyor.engine.waits`).
    An event and a wait meet on (tenant, event name, key); both sides take that key's lock
    (:meth:`lock_correlation`) before they write and then look for the other, so of a wait
    beginning and its event arriving at once, the second sees the first."""

    def lock_correlation(self, tenant_id: uuid.UUID, event: str, key: str) -> None:
        """Hold (tenant, event, key) until the transaction ends: a second holder waits for
        it, and its next statements see what the first committed. PostgreSQL: an advisory
        transaction lock; SQLite: its write lock, held from BEGIN IMMEDIATE already."""
        ...

    def add_event(self, event: EventRecord) -> None:
        """Keep ``event`` for the waits that begin before it expires."""
        ...

    def first_event(
        self,
        tenant_id: uuid.UUID,
        event: str,
        key: str,
        since: datetime,
        now: datetime,
        *,
        execution_id: uuid.UUID | None = None,
    ) -> EventRecord | None:
        """The earliest kept event of (tenant, event, key) that arrived at ``since`` or later
        and has not expired at ``now``; None when there is none. With ``execution_id``, an
        adapter whose database stamps both an execution's insert and an event's by its own
        clock (PostgreSQL) counts from that execution's stamp instead of ``since``: the
        processes that trigger and send may disagree on the time, the database does not."""
        ...

    def add_wait(self, wait: WaitRecord) -> None:
        """The row of a try that waits for its event (one a job: a later try's replaces it)."""
        ...

    def waits_for(self, tenant_id: uuid.UUID, event: str, key: str) -> list[WaitRecord]:
        """The waits on (tenant, event, key), oldest first (a row whose try no longer waits
        may be among them: the caller's resume refuses it)."""
        ...

    def pending_waits(self, tenant_id: uuid.UUID | None, event: str) -> list[WaitRecord]:
        """The tenant's waits on ``event`` whose job still waits, oldest first (the pending
        approvals, under :data:`~conveyor.engine.waits.APPROVAL_EVENT`); every tenant's with
        None (an operator's dashboard)."""
        ...

    def end_wait(self, job_id: uuid.UUID) -> None:
        """The job's wait row gone (its try woke, timed out or stopped)."""
        ...

    def due_waits(self, now: datetime, limit: int) -> list[WaitRecord]:
        """Up to ``limit`` waits whose timeout has come, locked (rows another sweep holds
        skipped), oldest timeout first."""
        ...

    def drop_expired_events(self, now: datetime, limit: int) -> int:
        """Up to ``limit`` events expired at ``now`` deleted, and the wait rows whose job no
        longer waits (stopped with its execution): how many events."""
        ...


class Store(
    Catalog,
    Executions,
    NodeStates,
    Jobs,
    MapItems,
    DeadLetters,
    Reruns,
    Deliveries,
    Schedules,
    Waits,
    Protocol,
):
    """Everything the engine and the scheduler ask of the database, one unit of work."""
