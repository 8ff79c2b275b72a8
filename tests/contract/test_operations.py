"""Cancel, promote and age, dead-letter repairs, on every adapter
(the cases of tests/unit/transitions/test_operations.py)."""

import pytest

from tests.unit.transitions.test_operations import *  # noqa: F403

pytestmark = pytest.mark.contract
