"""The http node's policy is the one the CONVEYOR_HTTP_* settings describe."""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import IPv4Address

import pytest

from conveyor.config import get_settings
from conveyor.http_node import configured


@pytest.fixture(autouse=True)
def fresh_settings() -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_the_defaults_allow_nothing_internal_read_4_mib_and_follow_5_redirects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("ALLOW", "MAX_RESPONSE_BYTES", "MAX_REDIRECTS"):
        monkeypatch.delenv(f"CONVEYOR_HTTP_{name}", raising=False)

    policy = configured()

    assert policy.allow.networks == () and not policy.allow.names
    assert (policy.max_response_bytes, policy.max_redirects) == (4 * 1024 * 1024, 5)


def test_the_settings_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_HTTP_ALLOW", "10.0.0.0/8, billing.internal,*.corp.example")
    monkeypatch.setenv("CONVEYOR_HTTP_MAX_RESPONSE_BYTES", "1000")
    monkeypatch.setenv("CONVEYOR_HTTP_MAX_REDIRECTS", "0")

    policy = configured()

    assert policy.allow.allows_address(IPv4Address("10.1.2.3"))
    assert policy.allow.allows_name("billing.internal")
    assert policy.allow.allows_name("a.corp.example")
    assert (policy.max_response_bytes, policy.max_redirects) == (1000, 0)
