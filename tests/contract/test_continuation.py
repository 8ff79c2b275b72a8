"""A chain's next step claimed in its predecessor's success (tests/unit/transitions/
test_continuation.py) on every adapter."""

import pytest

from tests.unit.transitions.test_continuation import *  # noqa: F403

pytestmark = pytest.mark.contract
