"""The application service: what the CLI, the API and the Celery tasks call, one module an
audience. Each method is one or two transactions through the unit of work, publishing through
the dispatcher only after commit. Nothing here knows Celery."""

from conveyor.service.approvals import Approvals
from conveyor.service.base import utcnow
from conveyor.service.clients import Clients
from conveyor.service.duties import Duties
from conveyor.service.operators import Operators
from conveyor.service.reads import Reads, TenantEvent
from conveyor.service.workers import Workers


class Conveyor(Clients, Reads, Approvals, Workers, Duties, Operators):
    """Triggers, runs and steers executions over a database and a dispatcher: every
    audience's methods on one object, built once per process by the composition root."""


__all__ = [
    "Approvals",
    "Clients",
    "Conveyor",
    "Duties",
    "Operators",
    "Reads",
    "TenantEvent",
    "Workers",
    "utcnow",
]
