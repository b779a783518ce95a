"""The alignment routes: who may post and fetch which set (the ring), what the service checks in
a blinded set, and what it keeps once the alignment is complete (positions only, no bodies)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import admin, assert_problem, bearer, create_session, http_client

from secure.psi import IDENTITY, BlindingKey, hash_to_group, pack
from secure.wire.alignment import SET_ENCODING, AlignmentCreate
from secure.wire.headers import ENCODING_HEADER, SHAPE_HEADER, SIGNATURE_HEADER
from service.alignment import AlignmentManager
from service.alignment.manager import PartyCaller, SetHead
from service.alignment.tables import WHOLE_SETS, AlignmentTables
from service.app import service_context
from service.domain_errors import AlignmentSlotForbidden, BadHeader, WrongShape
from service.store import Store

pytestmark = pytest.mark.anyio


def set_headers(count: int) -> dict[str, str]:
    return {
        "Content-Type": "application/octet-stream",
        "X-Glasu-Encoding": "ristretto255",
        "X-Glasu-Shape": str(count),
    }


def set_path(aid: str, party: int, owner: int, hop: int) -> str:
    return f"/v1/alignments/{aid}/parties/{party}/sets/{owner}/hops/{hop}"


async def create_alignment(client: httpx.AsyncClient, parties: int = 2) -> dict:
    response = await client.post("/v1/alignments", json={"parties": parties}, headers=admin())
    assert response.status_code == 201, response.text
    assert response.headers["location"] == f"/v1/alignments/{response.json()['alignment_id']}"
    return response.json()


def kept_bodies(app: FastAPI, aid: str) -> int:
    """Set bodies and signatures the service still holds for the alignment."""
    with service_context(app).store.transaction() as tx:
        return sum(
            tx.connection.execute(
                f"SELECT count(*) FROM {table} WHERE alignment_id = ?"
                " AND (body IS NOT NULL OR signature IS NOT NULL)",
                (aid,),
            ).fetchone()[0]
            for table in ("alignment_sets", "alignment_set_parts")
        )


def blinded(aid: str, ids: list[str], *keys: BlindingKey) -> list[bytes]:
    values = [hash_to_group(aid, node) for node in ids]
    for key in keys:
        values = key.blind_all(values)
    return values


async def put(
    client: httpx.AsyncClient,
    created: dict,
    party: int,
    owner: int,
    hop: int,
    body: bytes,
    *,
    signature: str | None = None,
) -> httpx.Response:
    signed = {} if signature is None else {"X-Glasu-Signature": signature}
    return await client.put(
        set_path(created["alignment_id"], party, owner, hop),
        content=body,
        headers={
            **set_headers(len(body) // 32),
            **signed,
            **bearer(created["party_tokens"][party]),
        },
    )


async def test_two_parties_get_their_positions_and_the_service_keeps_no_set(
    make_app: Callable[..., FastAPI],
) -> None:
    app = make_app()
    async with http_client(app) as client:
        created = await create_alignment(client)
        aid, tokens = created["alignment_id"], created["party_tokens"]
        k0, k1 = BlindingKey(), BlindingKey()
        own = {0: ["a", "b", "c"], 1: ["d", "c", "a", "e"]}
        positions_path = f"/v1/alignments/{aid}/parties/0/positions"
        waiting = await client.get(positions_path, params={"wait": 0}, headers=bearer(tokens[0]))
        assert waiting.status_code == 202 and waiting.json()["missing"] == [0, 1]
        for m, key in ((0, k0), (1, k1)):
            body = pack(blinded(aid, own[m], key))
            assert (await put(client, created, m, m, 0, body)).status_code == 201
            assert (await put(client, created, m, m, 0, body)).status_code == 200  # duplicate
        # party 1 blinds party 0's set further, and the other way round
        got = await client.get(set_path(aid, 1, 0, 0), headers=bearer(tokens[1]))
        assert got.status_code == 200 and got.headers["x-glasu-shape"] == "3"
        full0 = k1.blind_all([got.content[i : i + 32] for i in range(0, 96, 32)])
        assert (await put(client, created, 1, 0, 1, pack(full0))).status_code == 201
        got = await client.get(set_path(aid, 0, 1, 0), headers=bearer(tokens[0]))
        full1 = k0.blind_all([got.content[i : i + 32] for i in range(0, len(got.content), 32)])
        assert (await put(client, created, 0, 1, 1, pack(full1))).status_code == 201
        answers = []
        for m in (0, 1):
            response = await client.get(
                f"/v1/alignments/{aid}/parties/{m}/positions", headers=bearer(tokens[m])
            )
            assert response.status_code == 200
            answers.append(np.frombuffer(response.content, dtype="<i8"))
        status = (await client.get(f"/v1/alignments/{aid}", headers=bearer(tokens[1]))).json()
    # "a" and "c" are shared: the aligned index sorts them by their fully blinded value
    shared = sorted(blinded(aid, ["a", "c"], k0, k1))
    expected = {
        node: shared.index(value)
        for node, value in zip(["a", "c"], blinded(aid, ["a", "c"], k0, k1), strict=True)
    }
    assert answers[0].tolist() == [expected["a"], -1, expected["c"]]
    assert answers[1].tolist() == [-1, expected["c"], expected["a"], -1]
    assert status["state"] == "done" and status["aligned_nodes"] == 2
    assert [s["size"] for s in status["sets"]] == [3, 4]
    assert kept_bodies(app, aid) == 0


async def test_the_ring_decides_who_posts_and_who_fetches(client: httpx.AsyncClient) -> None:
    created = await create_alignment(client, parties=3)
    aid, tokens = created["alignment_id"], created["party_tokens"]
    body = pack(blinded(aid, ["x", "y"], BlindingKey()))
    response = await put(client, created, 1, 0, 0, body)  # party 0's own set, posted by party 1
    assert_problem(response, 403, "forbidden", mentions="party 0 blinds it")
    response = await put(client, created, 1, 0, 1, body)  # hop 1 before hop 0
    assert_problem(response, 409, "not-ready", mentions="hop 0")
    assert (await put(client, created, 0, 0, 0, body)).status_code == 201
    response = await put(client, created, 0, 0, 0, pack(blinded(aid, ["x", "z"], BlindingKey())))
    assert_problem(response, 409, "conflict")
    response = await put(client, created, 1, 0, 1, body[:32])
    assert_problem(response, 422, "wrong-shape", mentions="has 2 elements")
    for party, hop in ((2, 0), (0, 0)):  # hop 0 of party 0 goes to party 1 only
        response = await client.get(set_path(aid, party, 0, hop), headers=bearer(tokens[party]))
        assert_problem(response, 403, "forbidden", mentions="party 1 only")
    response = await client.get(set_path(aid, 2, 0, 2), headers=bearer(tokens[2]))
    assert_problem(response, 403, "forbidden", mentions="served to nobody")
    response = await client.get(set_path(aid, 0, 0, 3), headers=bearer(tokens[0]))
    assert_problem(response, 403, "forbidden", mentions="3 parties")
    waiting = await client.get(
        set_path(aid, 2, 1, 0), params={"wait": 0}, headers=bearer(tokens[2])
    )  # party 1's own set, which party 1 has not posted yet
    assert waiting.status_code == 202 and waiting.json() == {"status": "waiting", "missing": [1]}


async def test_a_blinded_set_must_be_distinct_group_elements(client: httpx.AsyncClient) -> None:
    created = await create_alignment(client)
    aid = created["alignment_id"]
    good = blinded(aid, ["x", "y"], BlindingKey())
    for body, mentions in (
        (pack([good[0], good[0]]), "same element twice"),
        (pack([good[0], IDENTITY]), "not a valid"),
        (pack([good[0], b"\xff" * 32]), "not a valid"),
        # the same element spelled twice: bit 255 set, which libsodium ignores when decoding
        (pack([good[0], good[0][:-1] + bytes([good[0][-1] | 0x80])]), "element 1 is not a valid"),
        (pack(good)[:-1], "bytes"),
    ):
        response = await client.put(
            set_path(aid, 0, 0, 0),
            content=body,
            headers={**set_headers(2), **bearer(created["party_tokens"][0])},
        )
        assert_problem(response, 422, "bad-payload", mentions=mentions)
    response = await client.put(
        set_path(aid, 0, 0, 0),
        content=pack(good),
        headers={
            **set_headers(2),
            "X-Glasu-Encoding": "int64",
            **bearer(created["party_tokens"][0]),
        },
    )
    assert_problem(response, 400, "bad-header", mentions="ristretto255")


async def test_a_signature_is_relayed_as_posted_and_dropped_with_the_body(
    make_app: Callable[..., FastAPI],
) -> None:
    app = make_app()
    async with http_client(app) as client:
        created = await create_alignment(client)
        aid, tokens = created["alignment_id"], created["party_tokens"]
        body = pack(blinded(aid, ["x", "y"], BlindingKey()))
        signature = "5a" * 64  # the service only relays it: the parties hold the keys
        for header, mentions in (("5a" * 63, "64 bytes"), ("zz" * 64, "64 bytes")):
            response = await put(client, created, 0, 0, 0, body, signature=header)
            assert_problem(response, 400, "bad-header", mentions=mentions)
        assert (await put(client, created, 0, 0, 0, body, signature=signature)).status_code == 201
        assert (await put(client, created, 0, 0, 0, body, signature=signature)).status_code == 200
        response = await put(client, created, 0, 0, 0, body, signature="a5" * 64)
        assert_problem(response, 409, "conflict", mentions="signature")
        got = await client.get(set_path(aid, 1, 0, 0), headers=bearer(tokens[1]))
        assert got.content == body and got.headers["x-glasu-signature"] == signature
        assert (await put(client, created, 1, 1, 0, body)).status_code == 201  # unsigned
        got = await client.get(set_path(aid, 0, 1, 0), headers=bearer(tokens[0]))
        assert "x-glasu-signature" not in got.headers
        for m in (0, 1):
            full = pack(blinded(aid, ["x", "y"], BlindingKey()))
            assert (await put(client, created, m, 1 - m, 1, full)).status_code == 201
    with service_context(app).store.transaction() as tx:
        sets = AlignmentTables(tx).sets(aid)
    assert sets and all(s.signature is None for s in sets) and kept_bodies(app, aid) == 0


async def test_tokens_are_bound_to_one_alignment_and_one_party(client: httpx.AsyncClient) -> None:
    first, second = await create_alignment(client), await create_alignment(client)
    session = await create_session(client)
    aid = first["alignment_id"]
    path = f"/v1/alignments/{aid}/parties/0/positions"
    cases = [
        ({}, 401, "unauthorized"),
        (bearer("not-a-token-at-all-0123456789"), 401, "unauthorized"),
        (admin(), 403, "forbidden"),
        (bearer(first["party_tokens"][1]), 403, "forbidden"),
        (bearer(second["party_tokens"][0]), 403, "forbidden"),
        (bearer(session["client_tokens"][0]), 401, "unauthorized"),
    ]
    for headers, status, slug in cases:
        assert_problem(await client.get(path, headers=headers), status, slug)
    response = await client.get(
        "/v1/alignments/nope/parties/0/positions", headers=bearer(first["party_tokens"][0])
    )
    assert_problem(response, 404, "alignment-not-found")
    for token in (first["party_tokens"][0], session["client_tokens"][0]):
        response = await client.post("/v1/alignments", json={"parties": 2}, headers=bearer(token))
        assert_problem(response, 403, "forbidden", mentions="admin")
    response = await client.get(f"/v1/alignments/{aid}", headers=bearer(second["party_tokens"][0]))
    assert_problem(response, 403, "forbidden")
    response = await client.post("/v1/alignments", json={"parties": 1}, headers=admin())
    assert_problem(response, 422, "validation-error", mentions="parties")


async def test_an_alignment_over_the_union_indexes_every_id_once(
    make_app: Callable[..., FastAPI],
) -> None:
    app = make_app()
    async with http_client(app) as client:
        response = await client.post(
            "/v1/alignments", json={"parties": 2, "nodes": "union"}, headers=admin()
        )
        created = response.json()
        aid, tokens = created["alignment_id"], created["party_tokens"]
        assert created["nodes"] == "union"
        keys = [BlindingKey(), BlindingKey()]
        own = {0: ["a", "b", "c"], 1: ["d", "c", "a", "e"]}
        for m in (0, 1):
            body = pack(blinded(aid, own[m], keys[m]))
            assert (await put(client, created, m, m, 0, body)).status_code == 201
        for m in (0, 1):  # each blinds the other's set further
            got = await client.get(set_path(aid, m, 1 - m, 0), headers=bearer(tokens[m]))
            values = [got.content[i : i + 32] for i in range(0, len(got.content), 32)]
            full = keys[m].blind_all(values)
            assert (await put(client, created, m, 1 - m, 1, pack(full))).status_code == 201
        answers = []
        for m in (0, 1):
            response = await client.get(
                f"/v1/alignments/{aid}/parties/{m}/positions", headers=bearer(tokens[m])
            )
            answers.append(np.frombuffer(response.content, dtype="<i8").tolist())
        status = (await client.get(f"/v1/alignments/{aid}", headers=bearer(tokens[0]))).json()
    ids = ["a", "b", "c", "d", "e"]
    union = sorted(blinded(aid, ids, *keys))
    index = dict(zip(ids, (union.index(v) for v in blinded(aid, ids, *keys)), strict=True))
    assert answers == [[index[i] for i in own[0]], [index[i] for i in own[1]]]
    assert (status["nodes"], status["aligned_nodes"], status["shared_nodes"]) == ("union", 5, 2)


def test_a_database_from_before_the_union_and_the_signatures_gains_their_columns(tmp_path) -> None:
    import sqlite3

    from service.alignment.tables import create_alignment_tables

    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:  # the alignments table as the first release wrote it
        db.execute(
            "CREATE TABLE alignments (id TEXT PRIMARY KEY, parties INTEGER NOT NULL, seed INTEGER"
            " NOT NULL, label TEXT, state TEXT NOT NULL, aligned_nodes INTEGER, digest BLOB,"
            " created_at REAL NOT NULL, updated_at REAL NOT NULL)"
        )
        db.execute("INSERT INTO alignments VALUES ('old', 2, 0, NULL, 'done', 7, NULL, 0, 0)")
        db.execute(
            "CREATE TABLE alignment_sets (alignment_id TEXT NOT NULL, owner INTEGER NOT NULL, hop"
            " INTEGER NOT NULL, size INTEGER NOT NULL, sha256 BLOB NOT NULL, body BLOB, created_at"
            " REAL NOT NULL, PRIMARY KEY (alignment_id, owner, hop))"
        )
        db.execute("INSERT INTO alignment_sets VALUES ('old', 0, 0, 3, x'00', NULL, 0)")
    store = Store(path)
    try:
        create_alignment_tables(store)
        with store.transaction() as tx:
            row = AlignmentTables(tx).alignment("old")
            sets = AlignmentTables(tx).sets("old")
            parts = AlignmentTables(tx).parts("old", 0, 0)
    finally:
        store.close()
    assert row is not None and (row.nodes, row.aligned_nodes, row.shared_nodes) == (
        "intersection",
        7,
        None,
    )
    assert [(s.size, s.signature) for s in sets] == [(3, None)]
    assert row.part_elements == WHOLE_SETS  # a set posted whole before is its own one part
    assert [(p.part, p.size) for p in parts] == [(0, 3)]


async def test_sets_and_positions_travel_in_parts_and_bad_parts_are_refused(
    make_app: Callable[..., FastAPI],
) -> None:
    app = make_app(max_body_bytes=128)  # 4 elements: a whole set of 5 could not travel
    async with http_client(app) as client:
        response = await client.post(
            "/v1/alignments", json={"parties": 2, "part_elements": 2}, headers=admin()
        )
        created = response.json()
        assert created["part_elements"] == 2
        aid, tokens = created["alignment_id"], created["party_tokens"]
        keys = [BlindingKey(), BlindingKey()]
        own = {0: ["a", "b", "c", "d", "e"], 1: ["e", "x", "c", "a"]}

        async def put_part(party: int, owner: int, hop: int, part: int, body: bytes, size: int):
            return await client.put(
                set_path(aid, party, owner, hop),
                params={"part": part},
                content=body,
                headers={**set_headers(size), **bearer(tokens[party])},
            )

        sets = {m: pack(blinded(aid, own[m], keys[m])) for m in (0, 1)}
        size0 = len(own[0])
        assert_problem(await put_part(0, 0, 0, 0, sets[0], size0), 413, "payload-too-large")
        # part 3 of 5 elements in parts of 2 does not exist; part 1 must hold 2 elements
        assert_problem(await put_part(0, 0, 0, 3, sets[0][:32], size0), 422, "wrong-shape")
        assert_problem(await put_part(0, 0, 0, 1, sets[0][64:96], size0), 422, "bad-payload")
        first = await put_part(0, 0, 0, 0, sets[0][:64], size0)
        assert first.status_code == 201 and first.json()["parts"] == 3
        assert (await put_part(0, 0, 0, 0, sets[0][:64], size0)).status_code == 200  # same again
        other = pack(blinded(aid, ["q", "r"], keys[0]))
        assert_problem(await put_part(0, 0, 0, 0, other, size0), 409, "conflict")
        assert_problem(await put_part(0, 0, 0, 1, sets[0][64:128], size0 + 1), 422, "wrong-shape")
        # a repeated element across parts is caught once the set is whole
        assert (await put_part(0, 0, 0, 1, sets[0][64:128], size0)).status_code == 201
        assert_problem(await put_part(0, 0, 0, 2, sets[0][:32], size0), 422, "bad-payload")
        status = (await client.get(f"/v1/alignments/{aid}", headers=admin())).json()
        assert status["sets"][0]["hops"] == 0  # not posted until every part is in
        assert (await put_part(0, 0, 0, 2, sets[0][128:], size0)).status_code == 201
        for part in range(2):
            body = sets[1][part * 64 : (part + 1) * 64]
            assert (await put_part(1, 1, 0, part, body, 4)).status_code == 201
        for m in (0, 1):  # each fetches the other's set part by part and blinds it further
            size = len(own[1 - m])
            got = b""
            for part in range(-(-size // 2)):
                response = await client.get(
                    set_path(aid, m, 1 - m, 0), params={"part": part}, headers=bearer(tokens[m])
                )
                assert response.headers["x-glasu-shape"] == str(size)
                got += response.content
            assert got == sets[1 - m]
            full = pack(keys[m].blind_all([got[i : i + 32] for i in range(0, len(got), 32)]))
            for part in range(-(-size // 2)):
                response = await put_part(
                    m, 1 - m, 1, part, full[part * 64 : (part + 1) * 64], size
                )
                assert response.status_code == 201
        answers = []
        for m in (0, 1):
            positions = b""
            for part in range(-(-len(own[m]) // 2)):
                response = await client.get(
                    f"/v1/alignments/{aid}/parties/{m}/positions",
                    params={"part": part},
                    headers=bearer(tokens[m]),
                )
                assert response.status_code == 200 and len(response.content) <= 2 * 8
                positions += response.content
            answers.append(np.frombuffer(positions, dtype="<i8").tolist())
        shared = sorted(blinded(aid, ["a", "c", "e"], *keys))
        index = {
            n: shared.index(v) for n, v in zip("ace", blinded(aid, list("ace"), *keys), strict=True)
        }
        assert answers == [[index.get(n, -1) for n in own[0]], [index.get(n, -1) for n in own[1]]]
        assert kept_bodies(app, aid) == 0
        response = await client.get(
            f"/v1/alignments/{aid}/parties/0/positions",
            params={"part": 3},
            headers=bearer(tokens[0]),
        )
        assert_problem(response, 422, "wrong-shape")


async def test_parts_must_fit_the_body_limit(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/alignments", json={"parties": 2, "part_elements": 2**26}, headers=admin()
    )
    assert_problem(response, 422, "validation-error", mentions="GLASU_MAX_BODY_BYTES")


def test_a_sets_head_is_refused_by_the_header_at_fault_before_any_body(tmp_path) -> None:
    """AlignmentManager.check_set_head, without HTTP: what the headers, the part and the ring
    decide is refused before a body exists, each header's fault named by its header."""
    store = Store(tmp_path / "glasu.sqlite3")
    try:
        alignments = AlignmentManager(store)
        created = alignments.create(AlignmentCreate(parties=2, seed=1, part_elements=2))
        first = PartyCaller(created.alignment_id, 0)
        signed = SetHead(shape="3", encoding=SET_ENCODING, signature="ab" * 64)
        size, signature, span, parts = alignments.check_set_head(first, 0, 0, 1, signed)
        assert (size, signature, span, parts) == (3, b"\xab" * 64, range(2, 3), 2)
        faults = {
            ENCODING_HEADER: SetHead(shape="3", encoding=None),
            SHAPE_HEADER: SetHead(shape="three", encoding=SET_ENCODING),
            SIGNATURE_HEADER: SetHead(shape="3", encoding=SET_ENCODING, signature="ab"),
        }
        for header, head in faults.items():
            with pytest.raises(BadHeader, match=header):
                alignments.check_set_head(first, 0, 0, 0, head)
        with pytest.raises(WrongShape):  # 3 elements in parts of 2: parts 0 and 1
            alignments.check_set_head(first, 0, 0, 2, signed)
        with pytest.raises(AlignmentSlotForbidden):  # party 1 posts hop 1 of party 0's set
            alignments.check_set_head(first, 0, 1, 0, signed)
    finally:
        store.close()
