"""The dashboard's pure parts: the DAG's layout and the session cookies with their CSRF
tokens."""

from __future__ import annotations

import uuid

from conveyor.ui import dag
from conveyor.ui.sessions import Signer

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
    session, cookie = signer.open(tenant, "acme", "abc123")

    read = signer.read(cookie)

    assert read == session and read.tenant_id == tenant and read.key_prefix == "abc123"
    assert signer.csrf_matches(session, signer.csrf(session))
    other, _ = signer.open(tenant, "acme", "abc123")
    assert not signer.csrf_matches(other, signer.csrf(session))
    assert not signer.csrf_matches(session, None)


def test_a_forged_or_foreign_cookie_reads_as_no_session() -> None:
    signer = Signer("secret")
    _, cookie = signer.open(uuid.uuid4(), "acme", "abc123")
    data, mac = cookie.rsplit(".", 1)

    assert Signer("another secret").read(cookie) is None
    assert signer.read(data[:-2] + "AA." + mac) is None
    assert signer.read("not a cookie") is None
    assert signer.read(None) is None


def test_the_key_itself_is_not_in_the_cookie() -> None:
    _, cookie = Signer("secret").open(uuid.uuid4(), "acme", "abc123")

    assert "cvk_" not in cookie
