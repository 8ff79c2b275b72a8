"""The ``conveyor`` command. :mod:`conveyor.cli.main` gathers the sub-commands, each in a module
of its own that imports only the shared :mod:`conveyor.cli.common` (and the definition files'
:mod:`conveyor.cli.definitions`), never the root."""

from conveyor.cli.main import app, main

__all__ = ["app", "main"]
