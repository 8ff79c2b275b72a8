"""The dashboard's pure parts: the DAG's layout and the session cookies with their CSRF
tokens."""

from __future__ import annotations

import base64
import uuid

import pytest

from conveyor.ui import dag
from conveyor.ui.sessions import Signer, csrf_matches

DIAMOND = [
    {"id": "start", "type": "python"},
    {"id": "a", "type": "python", "needs": ["start"]},
    {"id": "b", "type": "python", "needs": ["start"]},
    {"id": "join", "type": "map", "needs": ["a", "b"]},
]


def test_a_diamond_is_laid_out_in_columns_by_longest_path_so_every_edge_points_right() -> None:
    drawn = dag.layout(DIAMOND)

    at = {b.id: b for b in drawn.boxes}
    assert at["start"].x < at["a"].x == at["b"].x < at["join"].x
    assert at["a"].y != at["b"].y
    assert {(e.source, e.target) for e in drawn.edges} == {
        ("start", "a"), ("start", "b"), ("a", "join"), ("b", "join"),
    }  # fmt: skip
    assert all(e.x1 < e.x2 for e in drawn.edges)
    assert all(b.x + drawn.box_width <= drawn.width for b in drawn.boxes)
    assert all(b.y + drawn.box_height <= drawn.height for b in drawn.boxes)


def test_a_node_needing_a_later_listed_node_still_sits_after_it() -> None:
    drawn = dag.layout([{"id": "last", "needs": ["first"]}, {"id": "first"}])

    at = {b.id: b for b in drawn.boxes}
    assert at["first"].x < at["last"].x


def test_a_signed_session_reads_back_and_its_csrf_token_matches_only_it() -> None:
    signer = Signer("secret")
    tenant = uuid.uuid4()
    session, cookie = signer.open(tenant, "acme", "abc123", "key secret")

    read = signer.read(cookie, "key secret")

    assert read == session and read.tenant_id == tenant and read.key_prefix == "abc123"
    assert csrf_matches(signer.csrf(session, "key secret"), signer.csrf(session, "key secret"))
    other, _ = signer.open(tenant, "acme", "abc123", "key secret")
    assert not csrf_matches(signer.csrf(other, "key secret"), signer.csrf(session, "key secret"))
    assert not csrf_matches(signer.csrf(session, "key secret"), None)


def test_a_forged_or_foreign_cookie_reads_as_no_session() -> None:
    signer = Signer("secret")
    _, cookie = signer.open(uuid.uuid4(), "acme", "abc123", "key secret")
    data, mac = cookie.rsplit(".", 1)

    assert Signer("another secret").read(cookie, "key secret") is None
    assert signer.read(data[:-2] + "AA." + mac, "key secret") is None
    assert signer.read("not a cookie", "key secret") is None
    assert signer.read(None, "key secret") is None


def test_a_cookie_signed_before_its_key_signed_out_reads_as_no_session_even_unsecreted() -> None:
    # Given a process with no CONVEYOR_UI_SECRET, and a cookie signed with the key's secret
    signer = Signer("")
    session, cookie = signer.open(uuid.uuid4(), "acme", "abc123", "before")

    # Then another process with no secret reads it with that key's secret, and only with it
    assert Signer("").read(cookie, "before") == session
    assert signer.read(cookie, "after") is None  # the key signed out and in again
    assert signer.csrf(session, "before") != signer.csrf(session, "after")


@pytest.mark.parametrize("body", ["5", '"x"', "[1, 2, 3, 4, 5]", "{}", "[[], 1, 2, 3, 4]"])
def test_a_cookie_whose_unverified_body_is_not_a_session_claims_nothing(body: str) -> None:
    data = base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")

    assert Signer.claimed(f"{data}.mac") is None


def test_the_key_itself_is_not_in_the_cookie() -> None:
    _, cookie = Signer("secret").open(uuid.uuid4(), "acme", "abc123", "key secret")

    assert "cvk_" not in cookie
