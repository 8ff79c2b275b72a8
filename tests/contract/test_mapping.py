"""A map node's items (tests/unit/transitions/test_mapping.py) on every adapter."""

import pytest

from tests.unit.transitions.test_mapping import *  # noqa: F403

pytestmark = pytest.mark.contract
