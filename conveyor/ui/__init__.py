"""The web dashboard served under ``/ui`` by ``conveyor api`` and ``conveyor ui``: pages
rendered on the server from the REST API's own reads and service calls (see docs/ui.md)."""
