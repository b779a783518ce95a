"""The private entity alignment end to end: real parties (``clients/alignment.py``) against the
real service app, in process. Every request and response body is recorded: an id that only one
party holds never reaches the service or another party in a form they could test a guess
against; the intersection is exact and ordered the same at every party; no overlap is a clear
error."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from clients.admin import AdminClient
from clients.alignment import AlignmentClient, AlignmentFailed, AlignmentOutcome, align
from clients.alignment_signing import SetSigning
from clients.local.asgi import InProcessTransport
from clients.service_http import ConnectionOptions
from secure.psi import BlindingKey, hash_to_group, id_digest, pack, unpack
from service.app import create_app, service_context
from service.settings import ServiceSettings

BASE_URL = "http://glasu.test"


@dataclass
class Exchange:
    token: str
    request: bytes
    response: bytes


@dataclass
class RecordingTransport(httpx.BaseTransport):
    """Every body that crosses the wire, with the bearer token of who sent it."""

    inner: httpx.BaseTransport
    exchanges: list[Exchange] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sent = request.read() + str(request.url).encode()
        response = self.inner.handle_request(request)
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        with self.lock:
            self.exchanges.append(Exchange(token, sent, response.read()))
        return response


Rewrite = Callable[[str, list[bytes]], list[bytes]]


@dataclass
class LyingService(httpx.BaseTransport):
    """The real service, except that the set served at a path ending in ``victim_path`` comes
    back rewritten (``rewrite(alignment_id, elements)``), its other headers kept."""

    inner: InProcessTransport
    victim_path: str
    rewrite: Rewrite

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        path = request.url.path
        if request.method != "GET" or not path.endswith(self.victim_path):
            return response
        if response.status_code != 200:
            return response
        forged = pack(self.rewrite(path.split("/")[3], unpack(response.read())))
        headers = [(k, v) for k, v in response.headers.items() if k != "content-length"]
        return httpx.Response(200, headers=headers, content=forged)

    def shutdown(self) -> None:
        self.inner.shutdown()


@dataclass
class Run:
    alignment_id: str
    tokens: list[str]
    keys: list[BlindingKey]
    outcomes: list[AlignmentOutcome | BaseException]
    recorder: RecordingTransport

    def received_by(self, party: int) -> list[bytes]:
        return [e.response for e in self.recorder.exchanges if e.token == self.tokens[party]]

    def received_by_service(self) -> list[bytes]:
        return [e.request for e in self.recorder.exchanges]


def run_alignment(
    tmp_path: Path,
    party_ids: Sequence[Sequence[str]],
    *,
    signed: bool = False,
    lie: tuple[str, Rewrite] | None = None,
    peer_wait_seconds: float = 60,
) -> Run:
    """Every party's side, one thread each; ``lie``: (victim path, rewrite) for a
    :class:`LyingService` in front of the real one."""
    token = secrets.token_urlsafe(24)
    app = create_app(ServiceSettings(database=tmp_path / "service.sqlite3", admin_token=token))
    service: httpx.BaseTransport = InProcessTransport(app)
    if lie is not None:
        service = LyingService(service, *lie)  # type: ignore[arg-type]
    recorder = RecordingTransport(service)
    with AdminClient(base_url=BASE_URL, token=token, transport=recorder) as admin:
        created = admin.create_alignment({"parties": len(party_ids), "seed": 5})
    keys = [BlindingKey() for _ in party_ids]
    signing = SetSigning.generate(len(party_ids)) if signed else [SetSigning()] * len(party_ids)
    outcomes: list[AlignmentOutcome | BaseException] = [RuntimeError("not run")] * len(keys)

    def party(m: int) -> None:
        try:
            with AlignmentClient(
                base_url=BASE_URL,
                alignment_id=created["alignment_id"],
                party=m,
                token=created["party_tokens"][m],
                options=ConnectionOptions(
                    transport=recorder,
                    poll_seconds=min(2, peer_wait_seconds),
                    peer_wait_seconds=peer_wait_seconds,
                ),
            ) as client:
                outcomes[m] = align(client, party_ids[m], key=keys[m], signing=signing[m])
        except BaseException as exc:  # surfaced by the tests
            outcomes[m] = exc

    threads = [threading.Thread(target=party, args=(m,)) for m in range(len(party_ids))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    recorder.inner.shutdown()  # type: ignore[attr-defined]
    service_context(app).close()
    return Run(created["alignment_id"], created["party_tokens"], keys, outcomes, recorder)


def three_parties(shared: int = 40, own: int = 15) -> list[list[str]]:
    rng = np.random.default_rng(1)
    common = [f"customer-{secrets.token_hex(6)}" for _ in range(shared)]
    parties = []
    for name in ("bank", "insurer", "telco"):
        ids = common + [f"{name}-only-{secrets.token_hex(6)}" for _ in range(own)]
        parties.append([ids[i] for i in rng.permutation(len(ids))])
    return parties


def test_an_id_only_one_party_holds_reaches_nobody_in_a_testable_form(tmp_path: Path) -> None:
    party_ids = three_parties()
    run = run_alignment(tmp_path, party_ids)
    assert all(isinstance(o, AlignmentOutcome) for o in run.outcomes), run.outcomes
    aid, keys = run.alignment_id, run.keys
    service_saw = run.received_by_service()
    for owner, ids in enumerate(party_ids):
        others = [m for m in range(3) if m != owner]
        for node in (i for i in ids if "-only-" in i):
            point = hash_to_group(aid, node)
            testable = [node.encode(), id_digest(aid, node), point]  # anyone can compute these
            testable += [
                keys[m].blind(point) for m in others
            ]  # a guess blinded by a key != owner's
            full = keys[2].blind(keys[1].blind(keys[0].blind(point)))
            forms = testable + [form.hex().encode() for form in testable]
            assert not any(form in body for body in service_saw for form in forms), node
            for receiver in others:
                received = run.received_by(receiver)
                assert not any(form in body for body in received for form in forms), node
                # nor does any other party receive it blinded by every key (only the owner's
                # positions say where its own rows sit)
                assert not any(full in body for body in received), node
            # blinded by the owner's key alone, it goes to the next party in the ring only
            # (which cannot test a guess against it without the owner's key)
            single = keys[owner].blind(point)
            third = next(m for m in others if m != (owner + 1) % 3)
            assert not any(single in body for body in run.received_by(third))


def test_the_intersection_is_exact_and_the_same_at_every_party(tmp_path: Path) -> None:
    party_ids = three_parties(shared=60, own=25)
    run = run_alignment(tmp_path, party_ids)
    outcomes = [o for o in run.outcomes if isinstance(o, AlignmentOutcome)]
    assert len(outcomes) == 3
    shared = set(party_ids[0]).intersection(*party_ids[1:])
    index = [
        dict(zip(ids, o.rows.tolist(), strict=True))
        for ids, o in zip(party_ids, outcomes, strict=True)
    ]
    for node in shared:
        assert index[0][node] == index[1][node] == index[2][node] >= 0
    for ids, where in zip(party_ids, index, strict=True):
        assert all(where[node] == -1 for node in ids if node not in shared)
    assert {o.aligned_nodes for o in outcomes} == {len(shared)}
    assert len({o.digest for o in outcomes}) == 1 and {o.seed for o in outcomes} == {5}
    # the order is that of the fully blinded values: no party's ids or row order show in it
    full = {
        node: run.keys[2].blind(
            run.keys[1].blind(run.keys[0].blind(hash_to_group(run.alignment_id, node)))
        )
        for node in shared
    }
    by_value = sorted(shared, key=lambda node: full[node])
    assert [index[0][node] for node in by_value] == list(range(len(shared)))


def test_parties_that_share_nothing_are_told_so(tmp_path: Path) -> None:
    party_ids = [["a", "b", "c"], ["b", "c", "d"], ["x", "y"]]  # the third shares nothing
    run = run_alignment(tmp_path, party_ids)
    for outcome in run.outcomes:
        assert isinstance(outcome, AlignmentFailed)
        assert "share no node id" in str(outcome)


def test_two_parties(tmp_path: Path) -> None:
    run = run_alignment(tmp_path, [["1", "2", "3", "4"], ["4", "3", "9"]])
    first, second = run.outcomes
    assert isinstance(first, AlignmentOutcome) and isinstance(second, AlignmentOutcome)
    assert first.aligned_nodes == second.aligned_nodes == 2
    assert first.rows[2] == second.rows[1] and first.rows[3] == second.rows[0]
    assert first.rows[:2].tolist() == [-1, -1] and second.rows[2] == -1


def test_duplicate_ids_are_refused_before_anything_is_sent() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"nothing should be sent, got {request.url}")

    with (
        AlignmentClient(
            base_url=BASE_URL,
            alignment_id="a",
            party=0,
            token="t",
            options=ConnectionOptions(transport=httpx.MockTransport(refuse)),
        ) as client,
        pytest.raises(ValueError, match="'x' twice"),
    ):
        align(client, ["x", "y", "x"])


def with_bit_255(element: bytes) -> bytes:
    return element[:-1] + bytes([element[-1] | 0x80])  # libsodium ignores the bit: its twin


def posted_by(run: Run, party: int, path: str) -> bool:
    return any(
        e.token == run.tokens[party] and path.encode() in e.request for e in run.recorder.exchanges
    )


def test_a_party_refuses_a_relayed_set_that_spells_one_element_twice(tmp_path: Path) -> None:
    def respell(_: str, elements: list[bytes]) -> list[bytes]:
        return [elements[0], with_bit_255(elements[0]), *elements[2:]]

    lie = ("/parties/1/sets/0/hops/0", respell)
    run = run_alignment(tmp_path, [["a", "b", "c"], ["b", "c"]], lie=lie, peer_wait_seconds=3)
    refused = run.outcomes[1]
    assert isinstance(refused, AlignmentFailed), refused
    assert "hop 0 of party 0's set" in str(refused) and "element 1 is not a valid" in str(refused)
    assert not posted_by(run, 1, "/sets/0/hops/1")  # it blinded none of it


def guesses_in_place_of(ids: Sequence[str], size: int) -> Rewrite:
    """A service's dictionary attack: the hashes of guessed ids (some the victim holds) as the
    set the victim blinds next, ``size`` of them."""

    def guess(alignment_id: str, _: list[bytes]) -> list[bytes]:
        guessed = [*ids, *(f"guess-{i}" for i in range(size))][:size]
        return [hash_to_group(alignment_id, node) for node in guessed]

    return guess


def test_a_relayed_set_that_is_not_the_size_its_owner_declared_is_not_blinded(
    tmp_path: Path,
) -> None:
    party_ids = [["a", "b", "c"], ["b", "c", "d", "e"]]
    lie = ("/parties/1/sets/0/hops/0", guesses_in_place_of(party_ids[1], 6))
    run = run_alignment(tmp_path, party_ids, lie=lie, peer_wait_seconds=3)
    refused = run.outcomes[1]
    assert isinstance(refused, AlignmentFailed), refused
    assert "6 elements" in str(refused) and "declares 3" in str(refused)
    assert not posted_by(run, 1, "/sets/0/hops/1")  # no guess came back blinded


def test_with_signatures_a_party_blinds_only_what_its_peer_posted(tmp_path: Path) -> None:
    party_ids = [["a", "b", "c"], ["b", "c", "d", "e"]]
    run = run_alignment(tmp_path, party_ids, signed=True)
    assert all(isinstance(o, AlignmentOutcome) for o in run.outcomes), run.outcomes
    # the service swaps the set for guesses of the declared size: the signature gives it away
    lie = ("/parties/1/sets/0/hops/0", guesses_in_place_of(party_ids[1], 3))
    (tmp_path / "lie").mkdir()
    run = run_alignment(tmp_path / "lie", party_ids, signed=True, lie=lie, peer_wait_seconds=3)
    refused = run.outcomes[1]
    assert isinstance(refused, AlignmentFailed), refused
    assert "signature is not party 0's" in str(refused)
    assert not posted_by(run, 1, "/sets/0/hops/1")  # no guess came back blinded


def test_the_in_process_alignment_signs_every_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from clients.local import alignment as local

    signatures: list[str | None] = []

    class Recording(InProcessTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if request.method == "PUT":
                signatures.append(request.headers.get("x-glasu-signature"))
            return super().handle_request(request)

    monkeypatch.setattr(local, "InProcessTransport", Recording)
    outcomes = local.align_in_process([["a", "b"], ["b", "c"], ["b", "a"]], seed=1)
    assert [o.aligned_nodes for o in outcomes] == [1, 1, 1]
    assert len(signatures) == 9 and all(signatures)  # 3 sets x 3 hops
