"""The ``conveyor`` command. :mod:`conveyor.cli.main` lists the sub-commands and imports the
module of the one that runs; each module imports only the shared :mod:`conveyor.cli.common`
(and the definition files' :mod:`conveyor.cli.definitions`), never the root."""

from conveyor.cli.main import app, main

__all__ = ["app", "main"]
