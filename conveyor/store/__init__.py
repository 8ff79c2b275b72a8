"""The store layer: every SQL statement of Conveyor lives in this package."""

from conveyor.store.database import Database
from conveyor.store.sql import DEFAULT_TENANT, SqlStore

__all__ = ["DEFAULT_TENANT", "Database", "SqlStore"]
