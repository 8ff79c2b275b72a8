"""Abuse of the http node, against real servers on loopback: what a tenant's definition or an
execution's input must not reach (internal addresses in every spelling, through DNS, through
redirects, by rebinding), and what it must not make a worker read (huge or endless bodies).

The loopback servers stand for internal services; where a test needs a "public" one, a second
loopback address (127.0.0.2) is allowed and plays that part.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import socket
import ssl
import subprocess
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from conveyor import http_node
from conveyor.engine.addresses import AllowList
from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import (
    NodeError,
    NodeTimeout,
    NonRetryableError,
    OutboundRefused,
    ResponseTooLarge,
    TooManyRedirects,
)
from conveyor.service import Conveyor
from tests.support.outbound import http_allowed
from tests.support.services import wait_for

MiB = 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.headers.get("Host", "")))
        self.server.secrets.append(
            (self.headers.get("Authorization"), self.headers.get("X-Api-Key"))
        )
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path == "/json":
            self._send(200, json.dumps({"ok": True, "host": self.headers["Host"]}).encode())
        elif url.path == "/bytes":
            self._bytes(int(query["n"]), declared="declared" in query)
        elif url.path == "/gzip":
            body = gzip.compress(b"\0" * int(query["n"]))
            self._send(200, body, {"Content-Encoding": "gzip"})
        elif url.path == "/deflate":
            packer = zlib.compressobj(wbits=-zlib.MAX_WBITS if "raw" in query else zlib.MAX_WBITS)
            body = packer.compress(b'{"ok": true}') + packer.flush()
            self._send(200, body, {"Content-Encoding": "deflate"})
        elif url.path == "/gzip-json":
            self._send(200, gzip.compress(b'{"ok": true}'), {"Content-Encoding": "gzip"})
        elif url.path == "/bomb":
            self._send(200, _bomb(), {"Content-Encoding": "gzip"})
        elif url.path == "/bomb-twice":  # 256 MiB of zeros gzipped twice: about 1 KiB
            self._send(200, gzip.compress(_bomb()), {"Content-Encoding": "gzip, gzip"})
        elif url.path == "/br":
            self._send(200, b"\x0b\x02\x80{}\x03", {"Content-Encoding": "br"})
        elif url.path == "/text":
            self._send(
                200,
                "café".encode(query["charset"] if query["charset"] != "bogus" else "utf-8"),
                {"Content-Type": f"text/plain; charset={query['charset']}"},
            )
        elif url.path == "/redirect":
            self._send(302, b"", {"Location": query["to"]})
        elif url.path == "/loop":
            self._send(302, b"", {"Location": "/loop"})
        elif url.path == "/drip":
            self._drip()
        else:
            self._send(404, b"")

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _bytes(self, size: int, *, declared: bool) -> None:
        self.send_response(200)
        if declared:
            self.send_header("Content-Length", str(size))
        self.end_headers()  # undeclared: HTTP/1.0, the body ends when the connection closes
        chunk = b"a" * 65536
        try:
            for start in range(0, size, len(chunk)):
                self.wfile.write(chunk[: size - start])
        except OSError:
            pass  # the client stopped reading at its cap

    def _drip(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "100")
        self.end_headers()
        try:
            for _ in range(100):  # each byte well within a read timeout; the whole far past it
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass

    def log_message(self, *args: Any) -> None:
        pass


@functools.cache
def _bomb() -> bytes:
    """256 MiB of zeros, gzipped to about 250 KiB (made a MiB at a time)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    zeros = bytes(MiB)
    return b"".join(packer.compress(zeros) for _ in range(256)) + packer.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        super().__init__((host, port), _Handler)
        self.seen: list[tuple[str, str]] = []
        self.secrets: list[tuple[str | None, str | None]] = []
        self.tls_names: list[str | None] = []
        if tls is not None:
            tls.sni_callback = lambda sock, name, ctx: self.tls_names.append(name)
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.scheme = "https" if tls else "http"

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str = "", host: str | None = None) -> str:
        return f"{self.scheme}://{host or self.server_address[0]}:{self.port}{path}"


Serve = Callable[..., _Server]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start real HTTP(S) servers on loopback addresses; all are stopped after the test."""
    started: list[_Server] = []

    def start(host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None) -> _Server:
        server = _Server(host, port, tls)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def policy(*allow: str, max_bytes: int = 4 * MiB, redirects: int = 5) -> http_node.Outbound:
    return http_node.Outbound(
        allow=AllowList.parse(allow), max_response_bytes=max_bytes, max_redirects=redirects
    )


def answering(table: dict[str, list[str]]) -> http_node.Resolver:
    """A resolver that knows only the names in ``table``."""

    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]

    return resolve


def get(url: str, outbound: http_node.Outbound, **kwargs: Any) -> dict[str, Any]:
    return http_node.call({"url": url}, kwargs.pop("timeout", 5.0), outbound=outbound, **kwargs)


# -- addresses ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.1", "2130706433", "0x7f000001", "0177.0.0.1", "0x7f.1", "127.0.0.1.",
     "localhost", "LOCALHOST.", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]"],
)  # fmt: skip
def test_a_loopback_server_is_refused_by_default_in_every_spelling(serve: Serve, host: str) -> None:
    server = serve()

    with pytest.raises(OutboundRefused) as refused:
        get(server.url("/json", host=host), policy())

    assert "loopback" in str(refused.value)
    assert "CONVEYOR_HTTP_ALLOW" in str(refused.value)
    assert not refused.value.retryable
    assert server.seen == []


@pytest.mark.parametrize("host", ["0.0.0.0", "0", "[::]"])
def test_the_unspecified_address_which_linux_connects_to_the_host_itself_is_refused(
    serve: Serve, host: str
) -> None:
    server = serve()

    with pytest.raises(OutboundRefused, match="unspecified address"):
        get(server.url("/json", host=host), policy())

    assert server.seen == []


def test_a_host_name_the_system_resolves_to_loopback_is_refused_after_resolution(
    serve: Serve,
) -> None:
    # The machine's own name is in /etc/hosts: only the resolution shows where it leads.
    server, name = serve(), socket.gethostname()

    with pytest.raises(OutboundRefused, match=f"the host '{name.lower()}' resolves to a"):
        get(server.url("/json", host=name), policy())

    assert server.seen == []


def test_a_host_name_resolving_to_a_forbidden_address_is_refused_naming_the_name(
    serve: Serve,
) -> None:
    server = serve()
    resolver = answering({"internal.test": ["127.0.0.1"]})

    with pytest.raises(OutboundRefused) as refused:
        get(server.url("/json", host="internal.test"), policy(), resolver=resolver)

    assert "the host 'internal.test' resolves to a loopback address" in str(refused.value)
    assert "CONVEYOR_HTTP_ALLOW=internal.test" in str(refused.value)
    assert server.seen == []


def test_a_name_with_one_public_and_one_forbidden_answer_is_refused_not_tried_in_turn(
    serve: Serve,
) -> None:
    server = serve()
    resolver = answering({"mixed.test": ["93.184.215.14", "127.0.0.1"]})

    with pytest.raises(OutboundRefused, match=re.escape("'mixed.test' resolves to a loopback")):
        get(server.url("/json", host="mixed.test"), policy(), resolver=resolver)

    assert server.seen == []


def test_an_allowed_address_is_called_and_answers(serve: Serve) -> None:
    server = serve()

    assert get(server.url("/json", host="127.1"), policy("127.0.0.0/8")) == {
        "status": 200,
        "body": {"ok": True, "host": f"127.1:{server.port}"},
    }


def test_an_allowed_name_is_called_whatever_it_resolves_to(serve: Serve) -> None:
    server = serve()
    resolver = answering({"billing.internal": ["127.0.0.1"]})

    answer = get(
        server.url("/json", host="billing.internal"), policy("billing.internal"), resolver=resolver
    )

    assert answer["body"]["ok"] is True


def test_the_connection_goes_to_the_address_judged_with_the_name_in_the_host_header(
    serve: Serve,
) -> None:
    server = serve()
    resolver = answering({"pinned.test": ["127.0.0.1"]})

    answer = get(server.url("/json", host="pinned.test"), policy("127.0.0.1"), resolver=resolver)

    assert answer["body"]["host"] == f"pinned.test:{server.port}"


def test_dns_rebinding_cannot_reach_loopback_between_check_and_connection(serve: Serve) -> None:
    # Given a "public" server (127.0.0.2, allowed) and an internal one on 127.0.0.1, on the
    # same port, and a name whose first answer is the public one and every later the internal
    public = serve("127.0.0.2")
    internal = serve("127.0.0.1", public.port)
    answers = iter([["127.0.0.2"]])
    asked: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return next(answers, ["127.0.0.1"])

    # When the node calls that name twice
    first = get(public.url("/json", host="rebind.test"), policy("127.0.0.2"), resolver=rebinding)
    with pytest.raises(OutboundRefused, match=re.escape("'rebind.test' resolves to a loopback")):
        get(public.url("/json", host="rebind.test"), policy("127.0.0.2"), resolver=rebinding)

    # Then the first call went where its one resolution said, the second was refused
    assert first["body"]["host"] == f"rebind.test:{public.port}"
    assert asked == ["rebind.test", "rebind.test"]  # one resolution per connection
    assert internal.seen == []


# -- TLS to a pinned address -------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a certificate for pinned.test signed by it (openssl, EC keys: quick)."""
    where = tmp_path_factory.mktemp("tls")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=Conveyor test CA")  # fmt: skip
    openssl("req", *key, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=pinned.test")
    (where / "san.ext").write_text("subjectAltName=DNS:pinned.test\n")
    openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "leaf.pem", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    return where


def tls_server(serve: Serve, certificates: Path) -> _Server:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificates / "leaf.pem", certificates / "leaf.key")
    return serve(tls=context)


def test_tls_to_a_pinned_address_sends_the_name_as_sni_and_checks_the_certificate_against_it(
    serve: Serve, certificates: Path
) -> None:
    server = tls_server(serve, certificates)
    trust = ssl.create_default_context(cafile=str(certificates / "ca.pem"))
    resolver = answering({"pinned.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    allow = policy("127.0.0.1")

    answer = get(server.url("/json", host="pinned.test"), allow, resolver=resolver, verify=trust)
    with pytest.raises(NodeError, match="Hostname mismatch"):
        get(server.url("/json", host="other.test"), allow, resolver=resolver, verify=trust)

    assert answer["body"]["host"] == f"pinned.test:{server.port}"
    assert server.tls_names[:2] == ["pinned.test", "other.test"]


# -- redirects ---------------------------------------------------------------------------------


def test_a_redirect_from_an_allowed_server_to_a_forbidden_address_is_refused(
    serve: Serve,
) -> None:
    public, internal = serve("127.0.0.2"), serve("127.0.0.1")
    to = internal.url("/json")

    with pytest.raises(OutboundRefused) as refused:
        get(public.url(f"/redirect?to={to}"), policy("127.0.0.2"))

    assert f"(redirected to {to})" in str(refused.value)
    assert "the host '127.0.0.1' is the loopback address" in str(refused.value)
    assert internal.seen == []


def test_a_redirect_to_a_name_that_resolves_to_a_forbidden_address_is_refused(
    serve: Serve,
) -> None:
    public, internal = serve("127.0.0.2"), serve("127.0.0.1")
    resolver = answering({"public.test": ["127.0.0.2"], "internal.test": ["127.0.0.1"]})
    to = internal.url("/json", host="internal.test")

    with pytest.raises(OutboundRefused, match=re.escape("'internal.test' resolves to a loopback")):
        get(public.url(f"/redirect?to={to}", host="public.test"), policy("127.0.0.2"),
            resolver=resolver)  # fmt: skip

    assert internal.seen == []


def test_a_redirect_to_another_scheme_is_refused(serve: Serve) -> None:
    server = serve()

    with pytest.raises(OutboundRefused, match="has the scheme 'file'"):
        get(server.url("/redirect?to=file:///etc/passwd"), policy("127.0.0.1"))


def test_a_redirect_between_allowed_addresses_is_followed(serve: Serve) -> None:
    first, second = serve("127.0.0.2"), serve("127.0.0.3")
    allow = policy("127.0.0.2", "127.0.0.3")

    answer = get(first.url(f"/redirect?to={second.url('/json')}"), allow)

    assert answer == {"status": 200, "body": {"ok": True, "host": f"127.0.0.3:{second.port}"}}


def test_a_redirect_to_another_origin_drops_the_authorization_header_and_keeps_the_others(
    serve: Serve,
) -> None:
    first, second = serve("127.0.0.2"), serve("127.0.0.3")
    config = {
        "url": first.url(f"/redirect?to={second.url('/json')}"),
        "headers": {"Authorization": "Bearer secret", "X-Api-Key": "key"},
    }

    http_node.call(config, 5.0, outbound=policy("127.0.0.2", "127.0.0.3"))

    assert first.secrets == [("Bearer secret", "key")]
    assert second.secrets == [(None, "key")]  # as docs/security.md warns


def test_a_redirect_loop_stops_at_the_limit_naming_the_setting(serve: Serve) -> None:
    server = serve()

    with pytest.raises(TooManyRedirects, match=r"more than 3 times .*CONVEYOR_HTTP_MAX_REDIRECTS"):
        get(server.url("/loop"), policy("127.0.0.1", redirects=3))

    assert len(server.seen) == 4


def test_with_no_redirects_allowed_a_3xx_fails_the_node_without_a_retry(serve: Serve) -> None:
    server = serve()

    with pytest.raises(NodeError, match="answered 302 Found") as failed:
        get(server.url("/loop"), policy("127.0.0.1", redirects=0))

    assert not failed.value.retryable and len(server.seen) == 1


# -- sizes and time ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/bytes?n=2000000", "/bytes?n=2000000&declared=1", "/gzip?n=2000000"],
    ids=["streamed", "declared", "compressed"],
)
def test_a_body_past_the_cap_fails_the_node_naming_the_setting(serve: Serve, path: str) -> None:
    server = serve()

    with pytest.raises(ResponseTooLarge) as refused:
        get(server.url(path), policy("127.0.0.1", max_bytes=MiB))

    assert f"answered a body larger than {MiB} bytes" in str(refused.value)
    assert "CONVEYOR_HTTP_MAX_RESPONSE_BYTES" in str(refused.value)
    assert not refused.value.retryable


def peak_refusing(url: str) -> int:
    """The most memory traced while the node reads ``url`` and refuses it as too large."""
    _bomb()  # made before the count starts
    tracemalloc.start()
    try:
        with pytest.raises(ResponseTooLarge):
            get(url, policy("127.0.0.1", max_bytes=MiB))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def test_a_compression_bomb_is_stopped_without_being_inflated_whole(serve: Serve) -> None:
    peak = peak_refusing(serve().url("/bomb"))

    # A network read of 64 KiB of it inflates to 64 MiB; read by bounded steps, the peak is
    # the cap and a step or two.
    assert peak < 8 * MiB


def test_a_body_gzipped_twice_is_inflated_a_bounded_step_at_a_time_in_each_layer(
    serve: Serve,
) -> None:
    peak = peak_refusing(serve().url("/bomb-twice"))

    # "gzip, gzip" went to httpx's decoder, which inflated each layer whole (2 GB from 2 KB)
    assert peak < 8 * MiB


def test_a_body_in_a_coding_the_node_did_not_ask_for_is_refused_naming_it(serve: Serve) -> None:
    server = serve()

    with pytest.raises(NonRetryableError, match="Content-Encoding 'br'"):
        get(server.url("/br"), policy("127.0.0.1"))


def test_credentials_and_query_values_of_a_url_stay_out_of_the_node_s_errors(
    serve: Serve,
) -> None:
    # (the error is logged by the worker and shown with the execution)
    server = serve()
    secret_url = server.url("/nothing?api_key=T0PSECRET&page=2").replace(
        "http://", "http://bob:pa55word@"
    )

    with pytest.raises(NodeError) as failed:
        get(secret_url, policy("127.0.0.1"))
    with pytest.raises(OutboundRefused) as refused:
        get("http://bob:pa55word@10.0.0.5/x?api_key=T0PSECRET", policy())

    for error in (failed.value, refused.value):
        text = str(error)
        assert "T0PSECRET" not in text and "pa55word" not in text and "bob" not in text, text
        assert "api_key=…" in text, text
    assert "/nothing?api_key=…&page=…" in str(failed.value)


@pytest.mark.parametrize("path", ["/gzip-json", "/deflate", "/deflate?raw=1"])
def test_a_compressed_body_is_decoded(serve: Serve, path: str) -> None:
    server = serve()

    assert get(server.url(path), policy("127.0.0.1"))["body"] == {"ok": True}


@pytest.mark.parametrize("charset", ["utf-8", "latin-1", "bogus"])
def test_a_text_body_is_decoded_in_its_charset_or_as_utf_8(serve: Serve, charset: str) -> None:
    server = serve()

    assert get(server.url(f"/text?charset={charset}"), policy("127.0.0.1"))["body"] == "café"


def test_a_body_of_exactly_the_cap_is_read_whole(serve: Serve) -> None:
    server = serve()

    answer = get(server.url("/bytes?n=1000"), policy("127.0.0.1", max_bytes=1000))

    assert answer["body"] == "a" * 1000


def test_the_node_timeout_bounds_the_whole_request_not_each_read(serve: Serve) -> None:
    # A server that sends a byte every 0.1 s never trips a read timeout of 1 s; 10 s in all.
    server = serve()

    with pytest.raises(NodeTimeout, match="timed out after 1 s"):
        get(server.url("/drip"), policy("127.0.0.1"), timeout=1.0)


def test_the_node_timeout_covers_name_resolution(serve: Serve) -> None:
    server = serve()

    def stuck(host: str, port: int) -> list[str]:
        time.sleep(5)
        return ["127.0.0.1"]

    with pytest.raises(NodeTimeout, match=re.escape("timed out after 0.5 s")):
        get(server.url("/json", host="slow.test"), policy("127.0.0.1"), resolver=stuck,
            timeout=0.5)  # fmt: skip


def test_a_name_that_does_not_resolve_fails_the_try_for_a_retry(serve: Serve) -> None:
    server = serve()

    with pytest.raises(NodeError, match=re.escape("'nowhere.test' does not resolve")) as failed:
        get(server.url("/json", host="nowhere.test"), policy(), resolver=answering({}))

    assert failed.value.retryable


# -- through a workflow run --------------------------------------------------------------------


def fetch_workflow(service: Conveyor, url: str = "{{ input.url }}") -> None:
    node = {"id": "fetch", "type": "http", "config": {"url": url}, "retry": {"max_attempts": 3}}
    service.apply(parse_workflow({"name": "fetch", "nodes": [node]}))


def only_job(service: Conveyor, execution_id: Any) -> tuple[Any, list[Any]]:
    with service.db.transaction() as store:
        ((job, attempts),) = [(j, a) for j, a in store.execution_jobs(execution_id) if j.node_id]
    return job, attempts


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "2130706433"])
def test_a_url_from_the_input_cannot_reach_the_api_s_own_metrics(
    conveyor_service: Conveyor, api_url: str, host: str
) -> None:
    fetch_workflow(conveyor_service)
    port = urlsplit(api_url).port

    row = wait_for(
        conveyor_service,
        conveyor_service.trigger("fetch", {"url": f"http://{host}:{port}/metrics"}),
    )

    assert row.status is ExecutionStatus.FAILED
    assert "loopback" in (row.error or "") and "CONVEYOR_HTTP_ALLOW" in (row.error or "")
    job, attempts = only_job(conveyor_service, row.id)
    assert len(attempts) == 1 and job.status is JobStatus.DEAD_LETTER  # not retried
    assert row.output is None


def test_a_workflow_reaches_an_internal_server_the_operator_allowed(
    conveyor_service: Conveyor, serve: Serve
) -> None:
    server = serve()
    fetch_workflow(conveyor_service)

    with http_allowed("127.0.0.1"):
        row = wait_for(
            conveyor_service, conveyor_service.trigger("fetch", {"url": server.url("/json")})
        )

    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"fetch": {"status": 200, "body": {"ok": True, "host": server.url()[7:]}}}


def test_a_huge_response_fails_the_workflow_under_the_default_cap_and_is_not_stored(
    conveyor_service: Conveyor, serve: Serve
) -> None:
    server = serve()
    fetch_workflow(conveyor_service)

    with http_allowed("127.0.0.1"):
        row = wait_for(
            conveyor_service,
            conveyor_service.trigger("fetch", {"url": server.url("/bytes?n=30000000")}),
        )

    assert row.status is ExecutionStatus.FAILED
    assert "CONVEYOR_HTTP_MAX_RESPONSE_BYTES" in (row.error or "")
    assert f"larger than {4 * MiB} bytes" in (row.error or "")
    job, attempts = only_job(conveyor_service, row.id)
    assert len(attempts) == 1 and job.status is JobStatus.DEAD_LETTER


def test_the_api_refuses_a_definition_whose_written_url_is_the_metadata_service(
    api_url: str, make_key: Callable[[str], str]
) -> None:
    definition = {
        "name": "steal",
        "nodes": [{"id": "get", "type": "http",
                   "config": {"url": "http://169.254.169.254/latest/meta-data/"}}],
    }  # fmt: skip

    with httpx.Client(base_url=api_url, timeout=30) as client:
        answer = client.post(
            "/v1/workflows", json=definition, headers={"Authorization": f"Bearer {make_key('a')}"}
        )

    assert answer.status_code == 422
    (error,) = answer.json()["errors"]
    assert "the host '169.254.169.254' is the link-local (cloud metadata" in error
    assert "CONVEYOR_HTTP_ALLOW" in error
