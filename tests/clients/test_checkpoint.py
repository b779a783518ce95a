"""Worker checkpoints (clients/checkpoint.py): a client restored from its checkpoint computes
its next passes bit for bit as the uninterrupted one; damaged and foreign checkpoints are
refused with a message; writes are atomic; a resumed pass takes over a filled slot only with
the journaled plaintext."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from clients.checkpoint import CheckpointError, CheckpointStore, Fingerprint, WorkerProgress
from clients.pass_driver import PassDriver, ResumedPass, admit_release
from clients.service_http import ServiceError
from models.config import TrainConfig
from models.federated import GlasuClient
from models.inprocess import run_pass_inprocess
from models.joint import JointAggregation
from models.layout import layout_federation, session_schedule
from models.outcome import PassOutcome
from models.private import REPRODUCIBLE_NOISE_ENV, PrivateArrangement
from models.release import DpRelease, PassContext
from models.trainer import Security, prepare_security
from secure import files as files_module
from secure.aggregation import PlainCodec
from secure.files import atomic_write
from secure.noise import GaussianNoise
from secure.protocol import ShareRequest, SharesSum, plaintext_digest
from secure.release_noise import ReleaseKeyedNoise, ReleaseSecret
from secure.schedule import SessionSchedule

PLAIN = TrainConfig(
    rounds=4,
    eval_every=2,
    hidden=16,
    encryption="none",
    dp=False,
    seed=5,
    cache_rounds=2,  # the workset carries batches across rounds: it must be checkpointed
    instance_weighting=True,
    device="cpu",
)
PRIVATE = TrainConfig(
    rounds=4, eval_every=2, hidden=16, encryption="none", dp=True, epsilon=8.0, seed=5,
    device="cpu",
)  # fmt: skip


@dataclass
class Federation:
    clients: list[GlasuClient]
    security: Security
    schedule: SessionSchedule


def federation(config: TrainConfig, cora) -> Federation:
    layout = layout_federation(config, cora)
    schedule = session_schedule(config, cora)
    security = prepare_security(
        config, passes_total=schedule.passes_total, clients=len(layout.partitions)
    )
    clients = [
        security.make_client(part, layout, config, torch.device("cpu"))
        for part in layout.partitions
    ]
    return Federation(clients, security, schedule)


def run(fed: Federation, passes: range) -> list[list[PassOutcome]]:
    return [
        run_pass_inprocess(
            fed.clients,
            fed.security.aggregator,
            pass_index=p,
            kind=fed.schedule.passes[p].kind,
            output_nodes=fed.schedule.output_nodes(p),
        )
        for p in passes
    ]


def fingerprint(client: GlasuClient, config: TrainConfig, **changes: Any) -> Fingerprint:
    session = {"session_id": "session-a", "config": {"seed": config.seed}, "passes_total": 6}
    options = {"hidden": config.hidden, "lr": config.lr, "cache_rounds": config.cache_rounds}
    session.update(changes.pop("session", {}))
    options.update(changes.pop("options", {}))
    return Fingerprint.of(
        session=session,
        client=client.partition.client,
        options=options,
        encoding="float32",
        partition=client.partition,
    )


def stores(root: Path, clients: int) -> list[CheckpointStore]:
    return [CheckpointStore(root, session_id="session-a", client=m) for m in range(clients)]


def assert_same_state(a: GlasuClient, b: GlasuClient) -> None:
    for (name, x), (_, y) in zip(
        a.network.state_dict().items(), b.network.state_dict().items(), strict=True
    ):
        assert torch.equal(x, y), name
    assert torch.equal(a.generator.get_state(), b.generator.get_state())


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SECRET = ReleaseSecret(bytes(range(32)))  # the worker's, in its ledger


def use_keyed_noise(client: GlasuClient) -> None:
    """What the worker gives a private client without a noise seed."""
    release = client.joint.release
    if isinstance(release, DpRelease) and not release.settings.noise.reproducible:
        noise = ReleaseKeyedNoise(SECRET, scope=f"s/client{client.partition.client}")
        release.settings = replace(release.settings, noise=noise)


def resume_all(config: TrainConfig, cora, root: Path) -> Federation:
    """A new federation, every client restored from its checkpoint in ``root``."""
    fed = federation(config, cora)
    for client, store in zip(fed.clients, stores(root, len(fed.clients)), strict=True):
        use_keyed_noise(client)
        store.load(client, fingerprint(client, config))
    return fed


def test_a_restored_client_computes_the_next_passes_bit_for_bit(cora, tmp_path: Path) -> None:
    """W = 2 with instance weighting: the cached batches of earlier rounds are in the
    checkpoint; the restored clients' passes (train and eval) equal the uninterrupted ones."""
    fed = federation(PLAIN, cora)
    total = fed.schedule.passes_total
    k = 3  # after a train and an eval pass: the workset holds two rounds
    run(fed, range(k))
    for client, store in zip(fed.clients, stores(tmp_path, 3), strict=True):
        store.save(client, WorkerProgress(next_pass=k), fingerprint(client, PLAIN))
    uninterrupted = run(fed, range(k, total))
    resumed = resume_all(PLAIN, cora, tmp_path)
    assert [len(c.workset) for c in resumed.clients] == [2, 2, 2]
    assert run(resumed, range(k, total)) == uninterrupted  # every loss and accuracy, exactly
    for a, b in zip(fed.clients, resumed.clients, strict=True):
        assert_same_state(a, b)
        assert torch.equal(
            a.optimizer.state_dict()["state"][0]["exp_avg"],
            b.optimizer.state_dict()["state"][0]["exp_avg"],
        )


def test_a_restored_private_client_replays_its_seeded_noise(
    cora, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DP with --noise-seed (tests only): the generator's state is in the checkpoint, and so are
    the party-alone reference model, its optimiser and its dropout generator."""
    monkeypatch.setenv(REPRODUCIBLE_NOISE_ENV, "1")
    config = TrainConfig(**{**PRIVATE.__dict__, "noise_seed": 13})
    fed = federation(config, cora)
    total = fed.schedule.passes_total
    run(fed, range(2))
    for client, store in zip(fed.clients, stores(tmp_path, 3), strict=True):
        store.save(client, WorkerProgress(next_pass=2), fingerprint(client, config))
    uninterrupted = run(fed, range(2, total))
    resumed = resume_all(config, cora, tmp_path)
    outcomes = run(resumed, range(2, total))
    assert outcomes == uninterrupted
    assert outcomes[-1][0].reference_test_accuracy is not None
    for a, b in zip(fed.clients, resumed.clients, strict=True):
        assert isinstance(a.arrangement, PrivateArrangement)
        assert isinstance(b.arrangement, PrivateArrangement)
        assert_same_state(a, b)
        references = (a.arrangement.reference, b.arrangement.reference)
        for x, y in zip(*(r.parameters() for r in references), strict=True):
            assert torch.equal(x, y)


def test_release_keyed_noise_is_the_same_for_the_pass_a_checkpoint_precedes(
    cora, tmp_path: Path
) -> None:
    """Cryptographic noise derived from the release: the pass computed again after a crash
    sends the identical release (same sum, same Extract), and nothing about the noise is in
    the checkpoint."""
    fed = federation(PRIVATE, cora)
    for client in fed.clients:
        use_keyed_noise(client)
        assert client.joint.release.settings.noise.private  # type: ignore[attr-defined]
    run(fed, range(2))
    for client, store in zip(fed.clients, stores(tmp_path, 3), strict=True):
        store.save(client, WorkerProgress(next_pass=2), fingerprint(client, PRIVATE))
        assert store.read()["client"]["noise"] == {"kind": "release-keyed"}
    uninterrupted = run(fed, range(2, 3))
    resumed = resume_all(PRIVATE, cora, tmp_path)
    assert run(resumed, range(2, 3)) == uninterrupted
    for a, b in zip(fed.clients, resumed.clients, strict=True):
        assert_same_state(a, b)


def test_a_checkpoint_of_another_run_is_refused(cora, tmp_path: Path) -> None:
    fed = federation(PLAIN, cora)
    client = fed.clients[1]
    store = CheckpointStore(tmp_path, session_id="session-a", client=1)
    store.save(client, WorkerProgress(next_pass=0), fingerprint(client, PLAIN))
    with pytest.raises(CheckpointError, match=r"session_id: 'session-a' != 'session-b'"):
        store.load(client, fingerprint(client, PLAIN, session={"session_id": "session-b"}))
    with pytest.raises(CheckpointError, match=r"local_options\.lr: 0\.01 != 0\.02"):
        store.load(client, fingerprint(client, PLAIN, options={"lr": 0.02}))
    other = fed.clients[2]  # other data
    with pytest.raises(CheckpointError, match="features, edges or labels changed"):
        store.load(client, Fingerprint({**fingerprint(client, PLAIN).parts, "data": "x"}))
    with pytest.raises(CheckpointError, match="client: 1 != 2"):
        store.load(other, fingerprint(other, PLAIN))
    store.load(client, fingerprint(client, PLAIN))  # its own run: accepted


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "not-a-checkpoint", "digest"])
def test_a_damaged_checkpoint_is_refused(cora, tmp_path: Path, damage: str) -> None:
    fed = federation(PLAIN, cora)
    client = fed.clients[0]
    store = CheckpointStore(tmp_path, session_id="session-a", client=0)
    store.save(client, WorkerProgress(next_pass=1), fingerprint(client, PLAIN))
    data = store.path.read_bytes()
    if damage == "truncated":
        store.path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        store.path.write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        store.path.write_bytes(b"")
    elif damage == "not-a-checkpoint":
        torch.save({"kind": "something else"}, store.path)
    else:
        payload = torch.load(store.path, weights_only=True)
        payload["fingerprint"]["client"] = 7
        torch.save(payload, store.path)
    before = [p.detach().clone() for p in client.network.parameters()]
    with pytest.raises(CheckpointError, match=r"damaged|not a glasu worker checkpoint") as info:
        store.load(client, fingerprint(client, PLAIN))
    assert str(store.path) in str(info.value)
    assert all(torch.equal(a, b) for a, b in zip(before, client.network.parameters(), strict=True))


def test_atomic_write_leaves_the_old_file_or_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.pt"
    atomic_write(path, b"old")
    assert path.read_bytes() == b"old"

    def crash(*args: object) -> None:
        raise OSError("disk gone")

    for step in ("fsync", "replace"):
        with monkeypatch.context() as patch:
            patch.setattr(files_module.os, step, crash)
            with pytest.raises(OSError, match="disk gone"):
                atomic_write(path, b"new" * 1000)
        assert path.read_bytes() == b"old"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]  # no partial file
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


def test_an_unwritable_checkpoint_folder_is_a_clear_error(cora, tmp_path: Path) -> None:
    fed = federation(PLAIN, cora)
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    store = CheckpointStore(blocked, session_id="s", client=0)
    with pytest.raises(CheckpointError, match=r"cannot write the checkpoint .*--no-checkpoint"):
        store.save(fed.clients[0], WorkerProgress(), fingerprint(fed.clients[0], PLAIN))


# -- a resumed pass and a slot filled before the crash ---------------------------------------


class FilledSlotService:
    """A service whose slot holds another body (a CKKS share encrypted before the crash)."""

    def __init__(self) -> None:
        self.fetched: list[tuple[int, int]] = []
        self.parts: list[int] = []

    def put_share(self, pass_index: int, layer: int, payload: bytes, **_: Any) -> None:
        problem = {"type": "https://glasu.dev/problems/conflict", "detail": "slot taken"}
        raise ServiceError(409, problem, "PUT", f"/passes/{pass_index}/layers/{layer}/embedding")

    def fetch_sum(self, pass_index: int, layer: int, *, part: int = 0) -> SharesSum:
        self.fetched.append((pass_index, layer))
        self.parts.append(part)
        return SharesSum(payload=b"sum", count=3)


REQUEST = ShareRequest(layer=1, payload=b"re-encrypted", rows=2, cols=2, plaintext_digest="abc")


def driver(store: CheckpointStore, resume: ResumedPass | None) -> PassDriver:
    """A worker's driver over a service whose slot is filled, with checkpoints in ``store``."""
    return PassDriver(FilledSlotService(), checkpoints=store, resume=resume)  # type: ignore[arg-type]


def test_a_resumed_pass_takes_over_a_part_by_its_own_journal_entry(tmp_path: Path) -> None:
    """Each part of a share is journaled under its own key: part 1 of layer 1 is "1.1"."""
    store = CheckpointStore(tmp_path, session_id="s", client=0)
    second = ShareRequest(
        layer=1, payload=b"part 1", rows=2, cols=2, part=1, parts=2, plaintext_digest="abc"
    )
    resumed = driver(store, ResumedPass(pass_index=4, shares={"1": "other", "1.1": "abc"}))
    answer = resumed.exchange_share(4, second, encoding="ckks")
    assert answer == SharesSum(payload=b"sum", count=3) and resumed.service.parts == [1]  # type: ignore[attr-defined]
    assert store.uploads()["shares"] == {"1.1": "abc"}
    with pytest.raises(CheckpointError, match="part 1 of 2"):
        driver(store, ResumedPass(4, {"1": "abc"})).exchange_share(4, second, encoding="ckks")


def test_a_resumed_pass_takes_the_sum_when_its_share_is_the_journaled_one(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, session_id="s", client=0)
    resumed = driver(store, ResumedPass(pass_index=4, shares={"1": "abc"}))
    answer = resumed.exchange_share(4, REQUEST, encoding="ckks")
    assert answer == SharesSum(payload=b"sum", count=3) and resumed.service.fetched == [(4, 1)]  # type: ignore[attr-defined]
    assert store.uploads() == {"session_id": "s", "client": 0, "pass": 4, "shares": {"1": "abc"}}


def test_a_resumed_pass_refuses_a_filled_slot_with_another_plaintext(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, session_id="s", client=0)
    other = replace(REQUEST, plaintext_digest="xyz")
    resumed = driver(store, ResumedPass(pass_index=4, shares={"1": "abc"}))
    with pytest.raises(CheckpointError, match=r"pass 4, layer 1: .* differs from it"):
        resumed.exchange_share(4, other, encoding="ckks")
    unjournaled = driver(store, ResumedPass(pass_index=4, shares={}))
    with pytest.raises(CheckpointError, match="is not in its upload journal"):
        unjournaled.exchange_share(4, REQUEST, encoding="ckks")
    fresh = driver(store, None)
    with pytest.raises(ServiceError, match="conflict"):  # not resuming: a real conflict
        fresh.exchange_share(4, REQUEST, encoding="ckks")
    for each in (resumed, unjournaled, fresh):
        assert each.service.fetched == []  # type: ignore[attr-defined]


def test_every_part_carries_the_digest_of_its_plaintext() -> None:
    """What the upload journal records: the SHA-256 of the part as it was encoded, the same
    for the same plaintext (whatever its encryption), another for another."""
    share = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = plaintext_digest(share)
    assert plaintext_digest(share + 1) != first and plaintext_digest(share.copy()) == first
    assert first == hashlib.sha256(b"(2, 3)" + share.tobytes()).hexdigest()  # journals before
    joint = JointAggregation(PlainCodec(), clients=3, part_values=4, device=torch.device("cpu"))
    context = PassContext(pass_index=0, kind="eval", output_nodes=np.arange(3))
    own = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    step = joint.aggregate(context, 1, own, rows=np.arange(3))
    request = next(step)
    for part in range(2):  # 4 values per part: rows 0-1, then row 2
        assert isinstance(request, ShareRequest) and (request.part, request.parts) == (part, 2)
        sent = np.frombuffer(request.payload, "<f4").reshape(request.rows, request.cols)
        assert request.plaintext_digest == plaintext_digest(sent)
        np.testing.assert_array_equal(sent, own.numpy()[2 * part : 2 * part + 2])
        try:
            request = step.send(SharesSum(payload=request.payload, count=3))
        except StopIteration:
            assert part == 1


def test_noise_that_cannot_be_drawn_again_is_not_checkpointed(cora, tmp_path: Path) -> None:
    """A fresh cryptographic key per draw (no release-keyed noise, no seed): a resumed pass
    could not repeat its release, so the worker refuses to checkpoint it; and a checkpoint of
    release-keyed noise does not fit a worker with seeded noise."""
    fed = federation(PRIVATE, cora)
    client = fed.clients[0]
    store = CheckpointStore(tmp_path, session_id="session-a", client=0)
    with pytest.raises(CheckpointError, match=r"cannot checkpoint: .*--no-checkpoint"):
        store.save(client, WorkerProgress(), fingerprint(client, PRIVATE))
    assert not store.exists()
    use_keyed_noise(client)
    store.save(client, WorkerProgress(), fingerprint(client, PRIVATE))
    release = client.joint.release
    assert isinstance(release, DpRelease)
    release.settings = replace(release.settings, noise=GaussianNoise(seed=3))
    with pytest.raises(CheckpointError, match=r"does not fit this worker's noise"):
        store.load(client, fingerprint(client, PRIVATE))


def test_a_checkpoint_of_a_plain_client_does_not_fit_a_private_one(cora, tmp_path: Path) -> None:
    plain = federation(PLAIN, cora).clients[0]
    private = federation(PRIVATE, cora).clients[0]
    use_keyed_noise(private)
    store = CheckpointStore(tmp_path, session_id="session-a", client=0)
    store.save(plain, WorkerProgress(), fingerprint(plain, PLAIN))
    with pytest.raises(CheckpointError, match=r"glasu client, this one is private"):
        store.load(private, fingerprint(plain, PLAIN))


class CountingGate:
    """The owner's release gate, counting what it is asked to admit."""

    def __init__(self) -> None:
        self.admitted: list[tuple[int, int, str]] = []

    def admit(self, pass_index: int, *, layer: int, release: str, pass_kind: str | None) -> bool:
        self.admitted.append((pass_index, layer, release))
        return True


def test_the_parts_of_a_release_pass_the_gate_once(caplog: pytest.LogCaptureFixture) -> None:
    """All parts carry the release's digest: the gate admits it at part 0, the others follow
    without a second admission (and without a "not counted twice" line per part)."""
    gate = CountingGate()
    for part in range(3):
        request = ShareRequest(
            layer=1, payload=b"", rows=2, cols=2, release="d", part=part, parts=3
        )
        admit_release(gate, 7, request, pass_kind="eval")  # type: ignore[arg-type]
    assert gate.admitted == [(7, 1, "d")]
    assert "not counted twice" not in caplog.text
