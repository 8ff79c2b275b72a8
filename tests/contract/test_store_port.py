"""The store port's contracts (tests/unit/transitions/test_store_port.py) on every adapter."""

import pytest

from tests.unit.transitions.test_store_port import *  # noqa: F403

pytestmark = pytest.mark.contract
