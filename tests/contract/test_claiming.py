"""A node job's claim (tests/unit/transitions/test_claiming.py) on every adapter."""

import pytest

from tests.unit.transitions.test_claiming import *  # noqa: F403

pytestmark = pytest.mark.contract
