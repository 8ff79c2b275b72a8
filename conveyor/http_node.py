"""The ``http`` node's I/O: one request, its redirects, and a body read up to a cap.

Every connection goes to an address judged by ``engine/addresses.py`` *after* resolution:
the host is resolved once, each address it resolved to is judged, and the socket is opened to
one of those very addresses (a custom httpcore network backend), so a DNS answer that changes
between the check and the connection (rebinding) is never used. The URL, and so the ``Host``
header, TLS SNI and the certificate's host-name check, keep the name as written.

The node's timeout bounds the whole request: resolution, connection, TLS, every read and write
are given what is left of it. Environment proxies and ``.netrc`` are not used: a proxy would
resolve and connect on its own, and the worker's credentials are not for tenants' URLs.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpcore
import httpx

from conveyor import tracing
from conveyor.config import get_settings
from conveyor.engine import templates
from conveyor.engine.addresses import AllowList, ip_literal, judge_address, judge_url
from conveyor.engine.node_types import Step
from conveyor.exceptions import (
    NodeError,
    NodeTimeout,
    NonRetryableError,
    OutboundRefused,
    ResponseTooLarge,
    TooManyRedirects,
)

DEFAULT_TIMEOUT = 30.0
# The codings decoded here a bounded step at a time (a node's own header overrides it).
_ACCEPT = {"Accept-Encoding": "gzip, deflate"}


@dataclass(frozen=True, kw_only=True)
class Outbound:
    """What the http node may reach and read (``CONVEYOR_HTTP_*``)."""

    allow: AllowList
    max_response_bytes: int
    max_redirects: int


def configured() -> Outbound:
    """The settings' policy, parsed once per distinct value."""
    settings = get_settings()
    return _outbound(
        tuple(settings.http_allow), settings.http_max_response_bytes, settings.http_max_redirects
    )


@lru_cache(maxsize=8)
def _outbound(allow: tuple[str, ...], max_bytes: int, max_redirects: int) -> Outbound:
    return Outbound(
        allow=AllowList.parse(allow), max_response_bytes=max_bytes, max_redirects=max_redirects
    )


class Resolver(Protocol):
    """Host name to the addresses to try, in order (numeric strings)."""

    def __call__(self, host: str, port: int) -> list[str]: ...


def system_resolver(host: str, port: int) -> list[str]:
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def run(step: Step) -> dict[str, Any]:
    """The http node type's executor: its config rendered, then :func:`call` within what is
    left of the node's timeout."""
    config = templates.render_value(step.node.config, step.context, deadline=step.deadline)
    return call(config, step.left())


def call(
    config: dict[str, Any],
    timeout: float | None,
    *,
    outbound: Outbound | None = None,
    resolver: Resolver = system_resolver,
    verify: ssl.SSLContext | None = None,
) -> dict[str, Any]:
    """Send the node's request; ``{"status", "body"}`` (JSON parsed when it is JSON).

    Raises :class:`OutboundRefused` for a URL or address the policy refuses,
    :class:`ResponseTooLarge`, :class:`TooManyRedirects`, :class:`NodeTimeout`, or
    :class:`NodeError` (retryable for 5xx, 408, 425, 429 and network failures).
    """
    policy = outbound or configured()
    method = str(config.get("method", "GET")).upper()
    url = str(config["url"])
    seconds = timeout or DEFAULT_TIMEOUT
    what = f"{method} {shown(url)}"
    refused = judge_url(url, policy.allow)
    if refused is not None:
        raise OutboundRefused(f"{what}: {refused.message}")
    backend = _PinnedBackend(policy.allow, resolver, time.monotonic() + seconds)
    transport = _PinnedTransport(backend, verify or _default_context())
    with httpx.Client(
        transport=transport, trust_env=False, timeout=seconds, headers=_ACCEPT
    ) as client:
        try:
            request = client.build_request(
                method,
                url,
                headers=_traced(config.get("headers")),
                params=config.get("params"),
                json=config.get("json"),
                content=config.get("body"),
            )
            return _exchange(client, request, policy, what)
        except httpx.TimeoutException as exc:
            raise NodeTimeout(f"{what} timed out after {seconds:g} s") from exc
        except httpx.InvalidURL as exc:
            raise NonRetryableError(f"{what}: the URL is invalid ({exc})") from exc
        except httpx.HTTPError as exc:
            raise NodeError(f"{what} failed: {exc}") from exc


def _traced(headers: Any) -> Any:
    """The node's headers with the try's ``traceparent``, so that the called service's spans
    join the execution's trace; a node that sets the header itself keeps its own. Only
    ``traceparent``: the ``tracestate`` (and any baggage) is the trigger's caller's vendor
    data, for its own tracing systems, not for whatever service a node calls."""
    parent = tracing.traceparent()
    if parent is None:
        return headers
    given = httpx.Headers(headers)
    given.setdefault("traceparent", parent)
    return given


def shown(url: str | httpx.URL) -> str:
    """A URL as errors and logs may carry it: without its user and password, its query's
    values or its fragment, where credentials and tokens travel (a node's error is logged by
    the worker and shown with the execution)."""
    try:
        parts = urlsplit(str(url))
        names = parse_qsl(parts.query, keep_blank_values=True)
        host = parts.netloc.rpartition("@")[2]
    except ValueError:
        return "(a URL that does not parse)"
    query = "&".join(f"{name}=…" for name, _ in names)
    return urlunsplit((parts.scheme, host, parts.path, query, ""))


def _exchange(
    client: httpx.Client, request: httpx.Request, policy: Outbound, what: str
) -> dict[str, Any]:
    response = _send(client, request, what)
    redirects = 0
    while response.next_request is not None and policy.max_redirects:
        response.close()
        if redirects == policy.max_redirects:
            raise TooManyRedirects(
                f"{what} was redirected more than {policy.max_redirects} times (the most "
                f"CONVEYOR_HTTP_MAX_REDIRECTS allows); call the final URL directly"
            )
        request, redirects = response.next_request, redirects + 1
        hop = f"{what} (redirected to {shown(request.url)})"
        refused = judge_url(str(request.url), policy.allow)
        if refused is not None:
            raise OutboundRefused(f"{hop}: {refused.message}")
        response = _send(client, request, hop)
    try:
        if not response.is_success:
            retryable = response.status_code >= 500 or response.status_code in (408, 425, 429)
            raise NodeError(
                f"{what} answered {response.status_code} {response.reason_phrase}",
                retryable=retryable,
            )
        content = _read_capped(response, policy.max_response_bytes, what)
    finally:
        response.close()
    return {"status": response.status_code, "body": _parsed(content, response.encoding)}


def _parsed(content: bytes, charset: str | None) -> Any:
    """JSON when the body is JSON, else its text (in the declared charset if Python knows it)."""
    try:
        return json.loads(content)
    except ValueError:
        pass
    try:
        return content.decode(charset or "utf-8", errors="replace")
    except LookupError:
        return content.decode("utf-8", errors="replace")


def _send(client: httpx.Client, request: httpx.Request, what: str) -> httpx.Response:
    try:
        return client.send(request, stream=True, follow_redirects=False)
    except OutboundRefused as exc:  # raised by the backend, which does not know the URL
        raise OutboundRefused(f"{what}: {exc}") from None


def _read_capped(response: httpx.Response, cap: int, what: str) -> bytes:
    too_large = ResponseTooLarge(
        f"{what} answered a body larger than {cap} bytes, the most "
        f"CONVEYOR_HTTP_MAX_RESPONSE_BYTES lets the http node read; ask for less (a page, a "
        f"filter) or raise the setting"
    )
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > 18 or int(declared) > cap):
        raise too_large
    chunks, size = [], 0
    for chunk in _decoded(response, what):  # a compressed body counts at its decoded size
        size += len(chunk)
        if size > cap:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


_INFLATE_STEP = 262_144


def _decoded(response: httpx.Response, what: str) -> Iterator[bytes]:
    """The body, decoded a bounded step at a time, each coding in turn (``gzip, gzip`` is two
    layers): httpx inflates each network read whole, and 64 KiB of deflate can inflate to
    64 MiB before any cap sees it. A coding other than gzip or deflate, which the node does not
    ask for, is refused rather than handed to a decoder without a bound."""
    codings = [c.strip().lower() for c in response.headers.get("content-encoding", "").split(",")]
    body: Iterable[bytes] = response.iter_raw()
    for coding in reversed([c for c in codings if c and c != "identity"]):
        if coding not in ("gzip", "x-gzip", "deflate"):
            raise NonRetryableError(
                f"{what} answered a body in Content-Encoding {coding!r}; the http node decodes "
                f"gzip and deflate only (it asks for those): have the server send one of them"
            )
        body = _inflate(body, coding)
    yield from body


def _inflate(raw: Iterable[bytes], coding: str) -> Iterator[bytes]:
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16 if coding != "deflate" else zlib.MAX_WBITS)
    first = True
    try:
        for data in raw:
            while data:
                try:
                    yield inflater.decompress(data, _INFLATE_STEP)
                except zlib.error:
                    if not (first and coding == "deflate"):
                        raise
                    # "deflate" is sent both with its zlib header and without (raw)
                    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
                    first = False
                    continue
                first = False
                data = inflater.unconsumed_tail
        yield inflater.flush()
    except zlib.error as exc:
        raise httpx.DecodingError(f"the {coding} body does not decode: {exc}") from exc


@lru_cache(maxsize=1)
def _default_context() -> ssl.SSLContext:
    """The CA bundle (certifi, or SSL_CERT_FILE / SSL_CERT_DIR): built once, not per call."""
    return httpx.create_ssl_context()


class _PinnedTransport(httpx.HTTPTransport):
    """httpx's transport on a pool whose connections the pinned backend opens."""

    def __init__(self, backend: _PinnedBackend, context: ssl.SSLContext) -> None:
        super().__init__(verify=context, trust_env=False)
        # httpx offers no way to hand its pool a network backend (httpx#3749 proposes one);
        # handle_request uses this attribute, and the pinning tests fail if that changes.
        self._pool = httpcore.ConnectionPool(ssl_context=context, network_backend=backend)


class _PinnedBackend(httpcore.NetworkBackend):
    """Opens a connection only to an address the policy allows, the one it judged."""

    def __init__(self, allow: AllowList, resolver: Resolver, deadline: float) -> None:
        self._allow, self._resolver, self._deadline = allow, resolver, deadline
        self._system = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        failure: Exception | None = None
        for address in self._addresses(host, port):
            try:
                stream = self._system.connect_tcp(
                    address,
                    port,
                    timeout=_left(self._deadline, timeout, httpcore.ConnectTimeout),
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:
                failure = exc  # the next address may answer
                continue
            return _DeadlineStream(stream, self._deadline)
        raise failure or httpcore.ConnectError(f"{host!r} resolved to no address")

    def _addresses(self, host: str, port: int) -> list[str]:
        literal = ip_literal(host)
        if literal is not None:
            found = [str(literal)]
        else:
            found = _resolve(self._resolver, host, port, self._deadline)
        for address in found:
            parsed = ip_literal(address)
            if parsed is None:
                raise httpcore.ConnectError(f"{host!r} resolved to {address!r}, not an address")
            refused = judge_address(host, parsed, self._allow)
            if refused is not None:
                # Every answer is judged: a name that resolves to a public and a loopback
                # address is refused, not tried until the loopback one answers.
                raise OutboundRefused(refused.message)
        return found


def _resolve(resolver: Resolver, host: str, port: int, deadline: float) -> list[str]:
    """The resolver's answer within the deadline: getaddrinfo has no timeout of its own, so
    it runs on a thread of its own, abandoned if it takes too long."""
    answer: list[list[str] | BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            answer.append(resolver(host, port))
        except BaseException as exc:
            answer.append(exc)
        done.set()

    threading.Thread(target=run, name="conveyor-resolve", daemon=True).start()
    if not done.wait(_left(deadline, None, httpcore.ConnectTimeout)):
        raise httpcore.ConnectTimeout(f"resolving {host!r} took longer than the node's timeout")
    (result,) = answer
    if isinstance(result, OSError):
        raise httpcore.ConnectError(f"{host!r} does not resolve: {result}") from result
    if isinstance(result, BaseException):
        raise result
    return result


def _left(deadline: float, timeout: float | None, late: type[Exception]) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise late("the request ran past the node's timeout")
    return remaining if timeout is None else min(timeout, remaining)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every wait is cut to what is left of the node's timeout."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: float) -> None:
        self._stream, self._deadline = stream, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(self._deadline, timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(self._deadline, timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(self._deadline, timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._stream.start_tls(ssl_context, server_hostname, left), self._deadline
        )

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)
