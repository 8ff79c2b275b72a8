"""The HTTP server of ``conveyor api``: uvicorn's, ending the live streams before it waits.

At a shutdown uvicorn stops accepting connections, then waits for every response under way to
finish before it runs the app's shutdown. A live stream finishes only with its execution, so
it would wait for hours. This server first ends the streams (each closes cleanly, without a
finished status: a client opens it again on another process), then shuts down as uvicorn does.

uvicorn's own records (its start, each request's access line, an error in the app) go through
the process's logging (:func:`conveyor.logs.configure`, which the ``conveyor`` command calls):
on stderr, JSON when the logs are, at the level it set. uvicorn's default configuration would
give them handlers of their own, in its format, the access lines on stdout.
"""

from __future__ import annotations

import socket

import uvicorn

from conveyor.config import Settings


class ApiServer(uvicorn.Server):
    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state = getattr(self.config.app, "state", None)
        streams = getattr(state, "streams", None)
        if streams is not None:
            await streams.close()
        await super().shutdown(sockets)


def serve(host: str, port: int, settings: Settings | None = None) -> None:
    """Serve the API (built here, with the process's own service) until SIGINT or SIGTERM;
    ``settings``: the process's (CONVEYOR_*) unless given."""
    from conveyor.api.app import create_app

    app = create_app(settings=settings)
    # No log_config: uvicorn's loggers keep no handler of their own and propagate to the root
    # one; no log_level: they take the root's.
    ApiServer(uvicorn.Config(app, host=host, port=port, log_config=None, log_level=None)).run()
