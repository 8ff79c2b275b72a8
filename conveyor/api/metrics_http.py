"""Where ``/metrics`` is served, and to whom.

The metrics name tenants and workflows, and the API's port also takes webhooks, which must be
public: so the API's ``/metrics`` answers only a scraper sending ``Authorization: Bearer
<CONVEYOR_METRICS_TOKEN>``, and with no token set it is not served there at all (403). With
``CONVEYOR_METRICS_PORT`` the API process also serves them on a listener of its own (on
``CONVEYOR_METRICS_HOST``, loopback by default), to be reached only from the scraper's
network; the token, when set, is required there too.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from conveyor.exceptions import MetricsAuthError, MetricsNotServed

log = logging.getLogger("conveyor.api")

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def bearer_matches(authorization: str | None, token: str) -> bool:
    """Whether an Authorization header carries the token (compared in constant time)."""
    scheme, _, sent = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), token.encode())


def check_scrape(authorization: str | None, token: str) -> None:
    """Let a scrape of the API's own port through, or raise why not."""
    if not token:
        raise MetricsNotServed()
    if not bearer_matches(authorization, token):
        raise MetricsAuthError()


def _guarded(app: WsgiApp, token: str) -> WsgiApp:
    def guarded(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if token and not bearer_matches(environ.get("HTTP_AUTHORIZATION"), token):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")],
            )
            return [str(MetricsAuthError()).encode()]
        return app(environ, start_response)

    return guarded


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a line per scrape is noise
        pass


@contextmanager
def served_apart(registry: CollectorRegistry, host: str, port: int, token: str) -> Iterator[None]:
    """Serve the registry's metrics on a listener of their own while the block runs."""
    server = make_server(
        host, port, _guarded(make_wsgi_app(registry), token), ThreadingWSGIServer, _Quiet
    )
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    log.info("metrics served on http://%s:%s/metrics", host, port)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
