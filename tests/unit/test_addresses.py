"""The http node's address policy: every spelling of a forbidden address, and the allow-list."""

from __future__ import annotations

import re
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from conveyor.engine.addresses import (
    AllowList,
    address_class,
    ip_literal,
    judge_address,
    judge_url,
)

NOTHING = AllowList()


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0X7F000001", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0x7f.0.0.0x1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("0x", "0.0.0.0"),
        ("169.254.43518", "169.254.169.254"),
        ("2852039166", "169.254.169.254"),
        ("10.1", "10.0.0.1"),
        ("[::1]", "::1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
        ("[::ffff:7f00:1]", "::ffff:7f00:1"),
        ("fe80::1%eth0", "fe80::1"),
        ("fe80::1%25eth0", "fe80::1"),
        ("[FE80::1%25ETH0]", "fe80::1"),
    ],
)
def test_every_numeric_spelling_reads_as_the_address_the_resolver_would_use(
    host: str, address: str
) -> None:
    assert ip_literal(host) == ip_address(address)


@pytest.mark.parametrize(
    "host",
    ["example.com", "127.0.0.1.example.com", "08.0.0.1", "256.0.0.1", "1.2.3.4.5", "0x1g",
     "4294967296", "1.16777216", "", "::gg", "localhost"],
)  # fmt: skip
def test_hosts_that_are_not_numbers_are_names(host: str) -> None:
    assert ip_literal(host) is None


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("100.64.0.1", "shared"),
        ("100.100.100.200", "shared"),
        ("192.0.0.192", "IETF protocol assignment"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "'this network'"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
        ("192.0.2.1", "documentation"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("198.18.0.1", "benchmarking"),
        ("192.88.99.1", "6to4 relay"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fd00::1", "private (unique local"),
        ("fd00:ec2::254", "private (unique local"),
        ("fe80::1", "link-local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        ("3fff::1", "documentation"),
        ("100::1", "discard-only"),
        ("64:ff9b:1::1", "local-use NAT64"),
        ("2001:10::1", "IETF protocol assignment"),
        ("2001::1", "unspecified, as Teredo server 0.0.0.0"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "documentation (RFC 5737), as Teredo client"),
        ("4000::1", "reserved"),
        ("::ffff:127.0.0.1", "loopback, as IPv4-mapped 127.0.0.1"),
        ("::ffff:169.254.169.254", "link-local"),
        ("::ffff:10.0.0.1", "private"),
        ("::127.0.0.1", "loopback, as IPv4-compatible 127.0.0.1"),
        ("::8.8.8.8", "IPv4-compatible (deprecated"),
        ("64:ff9b::7f00:1", "loopback, as NAT64 of 127.0.0.1"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("2002:7f00:1::", "loopback, as 6to4 of 127.0.0.1"),
        ("2002:a9fe:a9fe::1", "link-local"),
    ],
)
def test_non_global_addresses_are_refused_with_their_class_named(address: str, kind: str) -> None:
    found = address_class(ip_address(address))
    assert found is not None and found.startswith(kind)


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "93.184.215.14", "172.32.0.1", "100.128.0.1", "192.0.0.9",
     "2606:4700:4700::1111", "2001:4860:4860::8888", "::ffff:8.8.8.8", "64:ff9b::808:808",
     "2002:808:808::1", "2001:3::1"],
)  # fmt: skip
def test_globally_reachable_addresses_are_called(address: str) -> None:
    assert address_class(ip_address(address)) is None


def test_a_refusal_names_the_class_the_host_and_the_setting_that_allows_it() -> None:
    refusal = judge_address("2130706433", IPv4Address("127.0.0.1"), NOTHING)

    assert refusal is not None
    assert refusal.message == (
        "the host '2130706433' is the loopback address 127.0.0.1, which the http node does not "
        "call; if the workflow must reach it, an operator can allow it with "
        "CONVEYOR_HTTP_ALLOW (e.g. CONVEYOR_HTTP_ALLOW=127.0.0.1)"
    )


def test_a_name_that_resolved_to_a_forbidden_address_is_named_without_the_address() -> None:
    refusal = judge_address("intranet.corp.", IPv4Address("10.1.2.3"), NOTHING)

    assert refusal is not None and refusal.host == "intranet.corp"
    assert "'intranet.corp' resolves to a private (RFC 1918) address" in refusal.message
    assert "10.1.2.3" not in refusal.message  # a tenant learns no internal DNS answer
    assert "CONVEYOR_HTTP_ALLOW=intranet.corp" in refusal.message


def test_the_allow_list_lets_networks_names_and_subdomains_through() -> None:
    allow = AllowList.parse(["10.0.0.0/8", " 127.0.0.1 ", "Billing.Internal.", "*.corp.example",
                             "fd00::/8", ""])  # fmt: skip

    assert judge_address("10.9.8.7", IPv4Address("10.9.8.7"), allow) is None
    assert judge_address("127.1", IPv4Address("127.0.0.1"), allow) is None
    assert judge_address("::ffff:127.0.0.1", IPv6Address("::ffff:7f00:1"), allow) is None
    assert judge_address("billing.internal", IPv4Address("192.168.0.5"), allow) is None
    assert judge_address("a.b.corp.example", IPv4Address("172.16.0.1"), allow) is None
    assert judge_address("x", IPv6Address("fd12::1"), allow) is None
    assert judge_address("127.0.0.2", IPv4Address("127.0.0.2"), allow) is not None
    assert judge_address("corp.example", IPv4Address("172.16.0.1"), allow) is not None
    assert judge_address("evilcorp.example", IPv4Address("172.16.0.1"), allow) is not None
    assert judge_address("other", IPv4Address("169.254.169.254"), allow) is not None


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "http://x", "*.", "a..b", "not a host"])
def test_an_allow_list_entry_of_no_kind_is_refused_naming_it(entry: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"CONVEYOR_HTTP_ALLOW entry {entry!r} is not")):
        AllowList.parse([entry])


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://127.1:8000/metrics", "'127.1' is the loopback address 127.0.0.1"),
        ("http://2130706433/", "loopback"),
        ("http://0x7f000001/", "loopback"),
        ("https://[::1]/", "'::1' is the loopback address ::1"),
        ("http://[::ffff:127.0.0.1]/", "loopback, as IPv4-mapped"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[fe80::1%25eth0]/", "link-local"),
        ("http://localhost:8000/metrics", "'localhost' resolves to a loopback address"),
        ("http://LOCALHOST./", "'localhost' resolves to a loopback"),
        ("http://api.localhost/", "'api.localhost' resolves to a loopback"),
        ("http://user:pw@10.0.0.1/", "private"),
        ("http://public.example@127.0.0.1/", "loopback"),
        ("file:///etc/passwd", "the scheme 'file'; the http node calls http:// and https://"),
        ("gopher://127.0.0.1:6379/_FLUSHALL", "the scheme 'gopher'"),
        ("http:///path", "has no host"),
    ],
)
def test_a_url_that_is_already_forbidden_as_written_is_refused(url: str, fragment: str) -> None:
    refusal = judge_url(url, NOTHING)

    assert refusal is not None and fragment in refusal.message


@pytest.mark.parametrize(
    "url", ["https://api.example.com/items", "http://8.8.8.8/", "https://[2606:4700::1111]/"]
)
def test_a_url_to_a_public_host_or_a_name_passes_until_resolution(url: str) -> None:
    assert judge_url(url, NOTHING) is None


def test_localhost_passes_when_the_operator_allowed_loopback() -> None:
    assert judge_url("http://localhost:9000/", AllowList.parse(["127.0.0.0/8"])) is None
    assert judge_url("http://localhost:9000/", AllowList.parse(["localhost"])) is None


def test_every_network_allowed_turns_the_check_off_for_a_development_machine() -> None:
    allow = AllowList.parse(["0.0.0.0/0", "::/0"])

    for address in ("127.0.0.1", "169.254.169.254", "::1", "fe80::1", "::ffff:10.0.0.1"):
        assert judge_address(address, ip_address(address), allow) is None
    assert judge_url("http://localhost:8000/", allow) is None
