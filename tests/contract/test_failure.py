"""A node's failed, stopped or lost try, on every adapter
(the cases of tests/unit/transitions/test_failure.py)."""

import pytest

from tests.unit.transitions.test_failure import *  # noqa: F403

pytestmark = pytest.mark.contract
