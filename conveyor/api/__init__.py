"""The HTTP face of Conveyor: the REST API (``/v1``), the webhook receiver (``/webhooks``) and
live status streams. Thin: it validates, calls the service, and answers.

Run it with ``conveyor api`` or ``uvicorn conveyor.api:app``.
"""

from conveyor.api.app import app, create_app

__all__ = ["app", "create_app"]
