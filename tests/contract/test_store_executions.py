"""The store port's contracts for executions and node states, on every adapter
(the cases of tests/unit/transitions/test_store_executions.py)."""

import pytest

from tests.unit.transitions.test_store_executions import *  # noqa: F403

pytestmark = pytest.mark.contract
