"""The store port's contracts for jobs, on every adapter
(the cases of tests/unit/transitions/test_store_jobs.py)."""

import pytest

from tests.unit.transitions.test_store_jobs import *  # noqa: F403

pytestmark = pytest.mark.contract
