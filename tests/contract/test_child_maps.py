"""Maps of children, and children that hold maps (tests/unit/transitions/test_child_maps.py)
on every adapter."""

import pytest

from tests.unit.transitions.test_child_maps import *  # noqa: F403

pytestmark = pytest.mark.contract
