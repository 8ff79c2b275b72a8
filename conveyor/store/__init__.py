"""The store layer: every SQL statement of Conveyor lives in this package. The engine sees it
only through the port (:class:`conveyor.engine.ports.Store`); :class:`Database` hands out the
adapter of its database (:class:`PostgresStore` or :class:`SqliteStore`) per unit of work."""

from conveyor.engine.states import DEFAULT_TENANT
from conveyor.store.postgres import PostgresStore
from conveyor.store.sql_store import SqlStore
from conveyor.store.sqlite import SqliteStore
from conveyor.store.unit_of_work import Database, store_on

__all__ = ["DEFAULT_TENANT", "Database", "PostgresStore", "SqlStore", "SqliteStore", "store_on"]
