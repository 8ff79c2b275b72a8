"""Which addresses the ``http`` node may reach: a pure decision, tested without a network.

By default only globally reachable unicast addresses are called. Loopback, private,
link-local (the cloud metadata services among them), multicast, unspecified, shared,
documentation and other special-purpose ranges are refused, in every spelling a resolver
accepts (``127.1``, ``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``[::ffff:127.0.0.1]``,
``[fe80::1%eth0]``, ``localhost.``): the I/O side (``conveyor/http_node.py``) judges the very
address it then connects to, after resolution, so DNS cannot change the answer in between.

An operator allows internal calls with ``CONVEYOR_HTTP_ALLOW`` (see :class:`AllowList`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_network
from urllib.parse import urlsplit

IPAddress = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

SETTING = "CONVEYOR_HTTP_ALLOW"
SCHEMES = ("http", "https")

# The special-purpose ranges of IANA's registries that are not globally reachable, each with
# the name a refusal gives it. The first match wins, so a narrow range precedes a wide one.
_V4: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/32", "unspecified"),
    ("0.0.0.0/8", "'this network' (0.0.0.0/8)"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "shared (carrier-grade NAT, RFC 6598)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata, RFC 3927)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignment (RFC 6890)"),
    ("192.0.2.0/24", "documentation (RFC 5737)"),
    ("192.88.99.0/24", "6to4 relay anycast (deprecated, RFC 7526)"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking (RFC 2544)"),
    ("198.51.100.0/24", "documentation (RFC 5737)"),
    ("203.0.113.0/24", "documentation (RFC 5737)"),
    ("224.0.0.0/4", "multicast"),
    ("255.255.255.255/32", "broadcast"),
    ("240.0.0.0/4", "reserved (240.0.0.0/4)"),
)
# Globally reachable exceptions inside the ranges above (IANA marks them so).
_V4_GLOBAL = ("192.0.0.9/32", "192.0.0.10/32")

_V6: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated, RFC 4291)"),
    ("64:ff9b:1::/48", "local-use NAT64 (RFC 8215)"),
    ("100::/64", "discard-only (RFC 6666)"),
    ("2001:db8::/32", "documentation (RFC 3849)"),
    ("2001:2::/48", "benchmarking (RFC 5180)"),
    ("2001::/23", "IETF protocol assignment (RFC 2928)"),
    ("3fff::/20", "documentation (RFC 9637)"),
    ("5f00::/16", "segment routing (RFC 9602)"),
    ("fc00::/7", "private (unique local, RFC 4193)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated, RFC 3879)"),
    ("ff00::/8", "multicast"),
)
_V6_GLOBAL = (
    "2001:1::1/128",
    "2001:1::2/128",
    "2001:3::/32",
    "2001:4:112::/48",
    "2001:20::/28",
    "2001:30::/28",
)
_GLOBAL_UNICAST_V6 = IPv6Network("2000::/3")
_NAT64 = IPv6Network("64:ff9b::/96")
_COMPATIBLE = IPv6Network("::/96")


def _table(rows: tuple[tuple[str, str], ...]) -> tuple[tuple[Network, str], ...]:
    return tuple((ip_network(cidr), name) for cidr, name in rows)


_V4_TABLE = _table(_V4)
_V6_TABLE = _table(_V6)
_GLOBAL = tuple(ip_network(cidr) for cidr in (*_V4_GLOBAL, *_V6_GLOBAL))


def address_class(address: IPAddress) -> str | None:
    """The name of the non-global class ``address`` belongs to; None for a global address.

    An IPv6 address that carries an IPv4 one to the network (IPv4-mapped, NAT64, 6to4,
    Teredo) is judged by the IPv4 address it leads to.
    """
    if any(address in network for network in _GLOBAL if network.version == address.version):
        return None
    if isinstance(address, IPv4Address):
        return _first(address, _V4_TABLE)
    for embedded, how in _embedded(address):
        inner = address_class(embedded)
        if inner is not None:
            return f"{inner}, as {how} {embedded}"
    if address.ipv4_mapped is not None or address in _NAT64:
        return None  # judged by the IPv4 address it carries, which is global
    found = _first(address, _V6_TABLE)
    if found is None and address not in _GLOBAL_UNICAST_V6:
        return "reserved (outside 2000::/3)"
    return found


def _first(address: IPAddress, table: tuple[tuple[Network, str], ...]) -> str | None:
    for network, name in table:
        if address in network:
            return name
    return None


def _embedded(address: IPv6Address) -> list[tuple[IPv4Address, str]]:
    found = []
    if address.ipv4_mapped is not None:
        found.append((address.ipv4_mapped, "IPv4-mapped"))
    if address in _NAT64:
        found.append((IPv4Address(int(address) & 0xFFFFFFFF), "NAT64 of"))
    if address in _COMPATIBLE and int(address) > 1:
        found.append((IPv4Address(int(address)), "IPv4-compatible"))
    if address.sixtofour is not None:
        found.append((address.sixtofour, "6to4 of"))
    if address.teredo is not None:
        server, client = address.teredo
        found += [(server, "Teredo server"), (client, "Teredo client")]
    return found


_NUMBER = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")


def normal_host(host: str) -> str:
    """A host as resolvers compare it: lower case, without brackets or one trailing dot."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") and not host.endswith("..") else host


def ip_literal(host: str) -> IPAddress | None:
    """The address a host written as a number stands for, as the C resolver reads it; None
    for a name.

    IPv4 follows ``inet_aton``: one to four parts, each decimal, octal (a leading 0) or hex
    (``0x``), the last filling the bytes that remain (``127.1`` is 127.0.0.1, ``2130706433``
    and ``0x7f000001`` too). IPv6 may carry a zone id (``fe80::1%eth0``, ``%25eth0`` in a URL).
    """
    host = normal_host(host)
    if ":" in host:
        try:
            return IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return None
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_NUMBER.match(p) for p in parts):
        return None
    try:
        numbers = [_number(p) for p in parts]
    except ValueError:
        return None  # 08: not octal, so the resolver treats the host as a name
    *head, last = numbers
    if any(n > 0xFF for n in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    value = last
    for index, byte in enumerate(head):
        value |= byte << (8 * (3 - index))
    return IPv4Address(value)


def _number(part: str) -> int:
    if part.startswith("0x"):
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        return int(part, 8)
    return int(part)


@dataclass(frozen=True, kw_only=True)
class AllowList:
    """What ``CONVEYOR_HTTP_ALLOW`` lets the http node reach despite its class.

    Entries, comma-separated, are of three kinds:

    - an address or network (``10.0.0.0/8``, ``127.0.0.1``, ``fd00::/8``): any address inside
      it may be called, whichever host name led there;
    - a host name (``billing.internal``): that exact name (case and a trailing dot aside) may
      be called whatever it resolves to, so its DNS is trusted;
    - ``*.`` and a domain (``*.corp.example``): every name below that domain, not the domain.
    """

    networks: tuple[Network, ...] = ()
    names: frozenset[str] = frozenset()
    domains: tuple[str, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """Read the entries; ValueError naming the first that is none of the three kinds."""
        networks: list[Network] = []
        names: set[str] = set()
        domains: list[str] = []
        for raw in entries:
            entry = normal_host(raw)
            if not entry:
                continue
            if entry.startswith("*.") and _is_name(entry[2:]):
                domains.append("." + entry[2:])
            elif (network := _network(entry)) is not None:
                networks.append(network)
            elif _is_name(entry):
                names.add(entry)
            else:
                raise ValueError(
                    f"{SETTING} entry {raw!r} is not an address, a network (10.0.0.0/8), "
                    f"a host name (billing.internal) or *.domain (*.corp.example)"
                )
        return cls(networks=tuple(networks), names=frozenset(names), domains=tuple(domains))

    def allows_name(self, host: str) -> bool:
        name = normal_host(host)
        return name in self.names or any(name.endswith(d) for d in self.domains)

    def allows_address(self, address: IPAddress) -> bool:
        candidates: list[IPAddress] = [address]
        if isinstance(address, IPv6Address):
            candidates += [embedded for embedded, _ in _embedded(address)]
        return any(a in n for a in candidates for n in self.networks if n.version == a.version)


def _network(entry: str) -> Network | None:
    address = ip_literal(entry) if "/" not in entry else None
    if address is not None:
        return ip_network(address)
    try:
        return ip_network(entry, strict=False)
    except ValueError:
        return None


_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")


def _is_name(text: str) -> bool:
    return 0 < len(text) <= 253 and all(_LABEL.match(label) for label in text.split("."))


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """Why the http node will not call a URL: the host as written, and a message that says
    why and how to allow it."""

    host: str
    message: str


def judge_address(host: str, address: IPAddress, allow: AllowList) -> Refusal | None:
    """Whether the node may connect to ``address``, which ``host`` (as written in the URL)
    led to; None when it may."""
    if allow.allows_name(host) or allow.allows_address(address):
        return None
    kind = address_class(address)
    if kind is None:
        return None
    literal = ip_literal(host)
    shown = normal_host(host)
    if literal is not None:
        what = f"the host {shown!r} is the {kind} address {literal}"
        entry = str(literal)
    else:
        what = f"the host {shown!r} resolves to a {kind} address"
        entry = shown
    return Refusal(
        host=shown,
        message=f"{what}, which the http node does not call; if the workflow must reach it, "
        f"an operator can allow it with {SETTING} (e.g. {SETTING}={entry})",
    )


def judge_url(url: str, allow: AllowList) -> Refusal | None:
    """What can be said of a URL before any resolution: its scheme, its host when written
    as an address, and ``localhost`` (which names loopback by definition, RFC 6761).

    A host name that resolves to a refused address passes here; the connection refuses it.
    """
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
    except ValueError as exc:
        return Refusal(host="", message=f"the URL {url!r} does not parse ({exc})")
    if parts.scheme.lower() not in SCHEMES:
        return Refusal(
            host=host,
            message=f"the URL {url!r} has the scheme {parts.scheme!r}; the http node calls "
            f"http:// and https:// URLs only",
        )
    if not host:
        return Refusal(host="", message=f"the URL {url!r} has no host; write http(s)://host/...")
    literal = ip_literal(host)
    if literal is not None:
        return judge_address(host, literal, allow)
    name = normal_host(host)
    if (name == "localhost" or name.endswith(".localhost")) and not allow.allows_name(name):
        return judge_address(name, IPv4Address("127.0.0.1"), allow)
    return None
