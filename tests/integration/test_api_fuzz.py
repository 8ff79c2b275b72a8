"""Property-based fuzzing of the whole HTTP API from its own OpenAPI schema (schemathesis).

It proves that no request a caller can send, valid or not, makes the API answer a server
error (5xx): every operation of the schema the app serves is called over real HTTP (uvicorn,
real PostgreSQL, Redis and the in-process worker) with inputs schemathesis generates from it
(its coverage and fuzzing phases, positive and negative), and every answer must be below 500.

The calls carry a valid API key of a tenant that owns a workflow, a finished execution and a
webhook endpoint of each signature scheme, and the generator is steered to those ids part of
the time (and to correctly signed webhook deliveries), so that it reaches the handlers' real
work instead of stopping at 401 or 404; part of the fuzzed calls keep the generated (wrong or
missing) credentials.

Bounded and repeatable for CI: Hypothesis is derandomized, with a fixed number of examples
per operation and no deadline, and draws none of the constants it would otherwise collect from
the modules the session happened to import (below).
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import itertools
import json
import string
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers as hypothesis_providers
from hypothesis.internal.constants_ast import Constants
from hypothesis.stateful import Bundle, MultipleResults, initialize, multiple
from schemathesis.checks import not_a_server_error
from schemathesis.core.transport import Response
from schemathesis.generation.case import Case
from schemathesis.generation.meta import TestPhase
from schemathesis.generation.stateful.state_machine import StepInput, StepOutput
from schemathesis.hooks import HookContext
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import func, select
from standardwebhooks import Webhook

from conveyor.api import create_app
from conveyor.engine.credentials import new_webhook_secret
from conveyor.engine.states import DeliveryStatus, ExecutionStatus, SignatureScheme
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution, WebhookDelivery
from conveyor.service import Conveyor, utcnow
from tests.integration.conftest import SCRAPER
from tests.support.services import wait_for

TENANT = "fuzz"
WORKFLOW = "fuzz-flow"
EVENT = "fuzz.event"
DELAY_NODE = {"id": "n", "type": "delay", "config": {"seconds": 0}}
EXAMPLES = 30  # per operation in the fuzzing phase; the coverage phase adds its own cases

# Header values requests sends as they are: printable ASCII without spaces or line breaks
# (longer than the 200 characters the delivery tables keep, now and then).
HEADER_TEXT = st.text(
    alphabet=string.ascii_letters + string.digits + "._:-,=/+", min_size=1, max_size=250
)
# Any text JSON can carry, NUL and lone surrogates included (json.dumps escapes them).
JSON_TEXT = st.text(st.characters(exclude_categories=()), max_size=20)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | JSON_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(JSON_TEXT, inner, max_size=3),
    max_leaves=8,
)

# No server error, and every answer (its status, media type, headers and body) one the schema
# documents for the operation: an error is a Problem wherever it comes from.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

# The schema the app serves, built at collection so that schemathesis makes one test per
# operation. (Its lazy loader, ``schemathesis.pytest.from_fixture``, fails on pytest 9.2, whose
# nodes have no ``_nodeid`` any more.) The first test proves it is the one served over HTTP.
# (A copy: schemathesis adds the links it infers to the schema it is given.) The tenant's
# live stream (GET /v1/stream) is left out: it never ends, so no generated call would return;
# tests/integration/test_tenant_stream_events.py and the acceptance test cover its input.
OPENAPI = create_app().openapi()
SCHEMA = schemathesis.openapi.from_dict(copy.deepcopy(OPENAPI)).exclude(path="/v1/stream")


@dataclass(frozen=True)
class Endpoint:
    id: uuid.UUID
    scheme: SignatureScheme
    secret: str


@dataclass(frozen=True)
class FuzzTenant:
    """What the fuzzed tenant owns, so that the generator can aim at ids that exist."""

    key: str
    workflow: str
    execution_id: uuid.UUID
    endpoints: tuple[Endpoint, ...]


_AIM: list[FuzzTenant] = []  # the running test's tenant, for the generator's hook
_SERIAL = itertools.count()


@pytest.fixture
def fuzz_tenant(conveyor_service: Conveyor, make_key: Callable[[str], str]) -> Iterator[FuzzTenant]:
    """The tenant, made afresh on the clean database of each test (one per operation)."""
    key = make_key(TENANT)
    endpoints = []
    with conveyor_service.db.transaction() as store:
        tenant_id = store.tenant_id(TENANT)
        for scheme in SignatureScheme:
            secret = new_webhook_secret(scheme)
            made = store.add_endpoint(tenant_id, f"fuzz-{scheme.value}", scheme, secret, utcnow())
            endpoints.append(Endpoint(made.id, scheme, secret))
    definition = {
        "name": WORKFLOW,
        "nodes": [DELAY_NODE],
        "events": [EVENT],
        "webhooks": [{"endpoint": f"fuzz-{scheme.value}"} for scheme in SignatureScheme],
    }
    conveyor_service.apply(parse_workflow(definition), TENANT)
    execution_id = conveyor_service.trigger(WORKFLOW, {"n": 1}, tenant=TENANT)
    wait_for(conveyor_service, execution_id)  # finished, so its event stream ends at once
    tenant = FuzzTenant(key, WORKFLOW, execution_id, tuple(endpoints))
    _AIM.append(tenant)
    yield tenant
    _AIM.remove(tenant)
    _settle(conveyor_service)


def _settle(service: Conveyor, timeout: float = 30.0) -> None:
    """Wait until the work the fuzzed calls started has finished, so that the next test's
    clean-up (TRUNCATE) does not race the worker's writes."""
    unfinished = (ExecutionStatus.PENDING, ExecutionStatus.RUNNING)
    deadline = time.monotonic() + timeout
    while True:
        with service.db.transaction() as store:
            running = store.session.scalar(
                select(func.count()).where(Execution.status.in_(unfinished))
            )
            received = store.session.scalar(
                select(func.count()).where(WebhookDelivery.status == DeliveryStatus.RECEIVED)
            )
        if not running and not received:
            return
        assert time.monotonic() < deadline, (
            f"after {timeout} s, {running} executions still run and {received} webhook "
            "deliveries wait to be handled"
        )
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_constants_from_the_sessions_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Hypothesis mixes into its draws the literals of every non-test module loaded in the
    process (``_get_local_constants``), so a derandomized run changed with what else the session
    imported (test_approvals.py brings in conveyor.cli and the modules under it) and with any
    literal anywhere in them (a settings bound): the linked sequences then reached no trigger.
    Drawing from none makes a run a function of this module and the schema alone. (A private
    name: if Hypothesis renames it, monkeypatch fails here, loudly.)"""
    monkeypatch.setattr(hypothesis_providers, "_get_local_constants", Constants)
    hypothesis_providers.CONSTANTS_CACHE.cache.clear()  # the pools other tests' draws made
    yield
    hypothesis_providers.CONSTANTS_CACHE.cache.clear()


def test_the_fuzzed_schema_is_the_one_the_api_serves(api_url: str) -> None:
    served = httpx.get(f"{api_url}/openapi.json", timeout=10)

    assert served.status_code == 200
    assert served.json() == OPENAPI


@SCHEMA.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
def test_no_generated_request_makes_the_api_answer_a_server_error(
    case: Case, api_url: str, fuzz_tenant: FuzzTenant
) -> None:
    # Fuzzed cases got their credentials from the hook below; the others get the valid key.
    fuzzed = case.meta is not None and case.meta.phase.name is TestPhase.FUZZING
    headers = {} if fuzzed else {"Authorization": f"Bearer {fuzz_tenant.key}"}

    response = case.call(base_url=api_url, headers=headers, timeout=20)

    case.validate_response(response, checks=CHECKS, headers=headers)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text}"


# -- sequences: one call's answer feeding the next (the schema's OpenAPI links) -------------------

SEQUENCES = 25  # scenarios, each of up to STEPS linked calls
STEPS = 7  # the initial state's (two calls) counts as one
APPLY = SCHEMA["/v1/workflows"]["POST"]
TRIGGER = SCHEMA["/v1/workflows/{name}/executions"]["POST"]


class LinkedCalls(SCHEMA.as_state_machine()):  # type: ignore[misc]
    """Schemathesis's state machine over the schema's links: apply a workflow, then trigger it
    by the name the answer gave, then read, cancel or stream the execution by the id the
    trigger gave; list executions or dead letters, then read one of them. Every answer must
    conform to the schema, none be a 5xx.

    Each sequence starts from a workflow and an execution of its own, so that from its first
    step a generated call can follow a link to something real: left to chance (an apply, then
    the link to its trigger, then the link to a read, in six steps among some seventy rules),
    most seeds reached no trigger or no read at all, and which seed the test got changed with
    any edit of this module or of the schema.

    Hypothesis replays a sequence's draws and requires the same rules to be open each time, so
    an answer must depend on the sequence's own calls only, never on the sequences before it
    or on timing: each sequence applies workflows of names of its own, and every execution a
    call starts has finished before the next call (a cancel then answers 409 and a stream
    ends at once, every time)."""

    base_url = ""
    key = ""
    # (method, path, status): how often a generated step (not the initial state) was answered so
    answered: Counter[tuple[str, str, int]] = Counter()
    _sequences = itertools.count()

    def setup(self) -> None:
        self.sequence = next(self._sequences)
        self.applies = 0
        self.starting = False

    @initialize(target=Bundle("answers"))  # each answer goes to the bundle its status names
    def a_workflow_and_an_execution(self) -> MultipleResults[StepOutput]:
        body = {"name": f"linked-{self.sequence}-start", "nodes": [DELAY_NODE]}
        applied = self._start(APPLY.Case(body=body, media_type="application/json"))
        name = applied.response.json()["name"]  # triggered by the name the answer gave
        triggered = self._start(TRIGGER.Case(path_parameters={"name": name}, body={}))
        return multiple(applied, triggered)

    def _start(self, case: Case) -> StepOutput:
        """A call of the initial state, checked as any step and recorded as the generated ones
        are (a later step's link looks its parent up in the recorder)."""
        step = StepInput.initial(case)
        self.recorder.record_case(case=case)
        self.control.record_step(step, self.recorder)
        self.starting = True
        try:
            output: StepOutput = self.step(step)
        finally:
            self.starting = False
        assert output.response.status_code == 201, output.response.text
        return output

    def before_call(self, case: Case) -> None:
        # every other apply is a valid definition: later steps then reach real workflows
        if not self.starting and (case.method, case.path) == ("POST", "/v1/workflows"):
            self.applies += 1
            if self.applies % 2:
                name = f"linked-{self.sequence}-{self.applies % 3}"
                case.body = {"name": name, "nodes": [DELAY_NODE]}
                case.media_type = "application/json"

    def after_call(self, response: Response, case: Case) -> None:
        if not self.starting:
            self.answered[(case.method, case.path, response.status_code)] += 1
        if response.status_code in (200, 201, 202) and case.method == "POST":
            started = response.json()
            ids = started.get("executions", [started.get("id")])
            for execution_id in filter(None, ids if isinstance(ids, list) else []):
                self._finished(execution_id)

    def _finished(self, execution_id: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            read = httpx.get(
                f"{self.base_url}/v1/executions/{execution_id}", headers=self._auth(), timeout=10
            )
            if read.status_code != 200 or ExecutionStatus(read.json()["status"]).finished:
                return
            time.sleep(0.02)
        raise AssertionError(f"execution {execution_id} did not finish within {timeout} s")

    def get_call_kwargs(self, case: Case) -> dict[str, object]:
        return {"base_url": self.base_url, "headers": self._auth(), "timeout": 20}

    def validate_response(  # type: ignore[override]
        self, response: Response, case: Case, additional_checks: object = None, **kwargs: object
    ) -> None:
        case.validate_response(response, checks=CHECKS, headers=self._auth())
        assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text}"

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def test_no_sequence_of_linked_calls_makes_the_api_answer_off_schema_or_a_server_error(
    api_url: str, fuzz_tenant: FuzzTenant
) -> None:
    LinkedCalls.base_url, LinkedCalls.key = api_url, fuzz_tenant.key

    LinkedCalls.run(
        settings=settings(
            max_examples=SEQUENCES,
            stateful_step_count=STEPS,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )

    # and the generated steps' links led somewhere: executions made, then read by the id an
    # answer gave
    reached = LinkedCalls.answered
    assert reached["POST", "/v1/workflows/{name}/executions", 201] > 0, reached
    assert reached["GET", "/v1/executions/{execution_id}", 200] > 0, reached


# -- steering the generator --------------------------------------------------------------------


@SCHEMA.hook("flatmap_case")
def aim_at_what_exists(context: HookContext, case: Case) -> st.SearchStrategy[Case]:
    return _aimed(case, _AIM[-1]) if _AIM else st.just(case)


@st.composite
def _aimed(draw: st.DrawFn, case: Case, tenant: FuzzTenant) -> Case:
    """The generated case, mostly with the tenant's key, part of the time pointed at the
    tenant's own rows (or, for a webhook, made a delivery to one of its endpoints)."""
    if case.path.startswith("/v1/") and _chance(draw, 3, 1):  # else the generated ones
        case.headers["Authorization"] = f"Bearer {tenant.key}"  # case-insensitive: replaces
    if case.path == "/metrics" and _chance(draw, 1, 1):  # the scraper's token, or none
        case.headers = {**(case.headers or {}), **SCRAPER}
    params = case.path_parameters or {}
    if "endpoint_id" in params:
        if _chance(draw, 1, 1):
            _deliver(draw, case, draw(st.sampled_from(tenant.endpoints)))
        return case
    known = {"name": tenant.workflow, "execution_id": str(tenant.execution_id)}
    if known.keys() & params.keys() and _chance(draw, 1, 1):
        case.path_parameters = {k: known.get(k, v) for k, v in params.items()}
    if case.path == "/v1/events" and isinstance(case.body, dict) and _chance(draw, 1, 1):
        case.body = {**case.body, "type": EVENT}
    return case


def _chance(draw: st.DrawFn, yes: int, no: int) -> bool:
    """True in about ``yes`` of ``yes + no`` draws (a bit more: Hypothesis favours the first)."""
    return draw(st.sampled_from([True] * yes + [False] * no))


def _deliver(draw: st.DrawFn, case: Case, endpoint: Endpoint) -> None:
    """Make the case a delivery to the endpoint: signed right, signed wrong, or stale."""
    payload = draw(
        st.one_of(
            st.dictionaries(JSON_TEXT, JSON_VALUES).map(lambda extra: {**extra, "type": EVENT}),
            JSON_VALUES,
        ).map(lambda value: json.dumps(value).encode())
        | st.text().map(str.encode)
        | st.binary(max_size=64)
    )
    # Hypothesis favours short ids like '0': a serial number keeps most of them new (not a 409).
    delivery_id = f"{draw(HEADER_TEXT)}.{next(_SERIAL)}"
    how = draw(st.sampled_from(["right", "stale", "garbled"]))
    headers: dict[str, str]
    if endpoint.scheme is SignatureScheme.STANDARD:
        at = datetime.now(UTC) - (timedelta(minutes=10) if how == "stale" else timedelta())
        signature = Webhook(endpoint.secret).sign(delivery_id, at, payload.decode(errors="replace"))
        headers = {
            "webhook-id": delivery_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": draw(HEADER_TEXT) if how == "garbled" else signature,
        }
    else:
        digest = hmac.new(endpoint.secret.encode(), payload, hashlib.sha256).hexdigest()
        headers = {
            "X-Hub-Signature-256": draw(HEADER_TEXT) if how == "garbled" else f"sha256={digest}",
            "X-GitHub-Delivery": delivery_id,
            "X-GitHub-Event": draw(HEADER_TEXT),
        }
    case.path_parameters = {"endpoint_id": str(endpoint.id)}
    case.media_type = "application/json"
    case.body = payload
    case.headers.update(headers)
