"""Child workflows (tests/unit/transitions/test_children.py) on every adapter."""

import pytest

from tests.unit.transitions.test_children import *  # noqa: F403

pytestmark = pytest.mark.contract
