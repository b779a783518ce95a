"""The deployed alignment against a real `glasu serve` on loopback: the operator's
`glasu align create`, each party's `glasu align run` on its prepared folder, then
`glasu session create --alignment`; every folder then loads as a worker's partition over the same
shared node index and split as the session's."""

from __future__ import annotations

import csv
import itertools
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest

from clients.admin import AdminClient
from clients.cli.main import main
from clients.local.session import aligned_session_request
from models.config import TrainConfig
from models.data.partition import load_partition
from secure.wire.node_lists import EncodedNodes, decode_nodes

SHARED = [f"person-{i:03d}" for i in range(0, 40, 2)]  # 20 ids every party holds


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("align-cmd")
    token = root / "admin.token"
    token.write_text(secrets.token_urlsafe(32) + "\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASU_")}
    log = (root / "service.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "clients.cli.main", "serve", "--log-level", "warning", "--port",
         str(port), "--database", str(root / "db.sqlite3"), "--admin-token-file", str(token)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (root / "service.log").read_text()
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        yield {"url": url, "token_file": str(token)}
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def decoded(nodes: dict) -> list[int]:
    """A node list of a session body, as ids."""
    return decode_nodes(EncodedNodes.model_validate(nodes)).tolist()


def prepared_party(root: Path, m: int, *, label_every: int = 1) -> Path:
    """Party m: the shared ids and ten of its own, its own order, its own feature (m + id)."""
    rng = np.random.default_rng(m)
    ids = SHARED + [f"own-{m}-{i}" for i in range(10)]
    ids = [ids[i] for i in rng.permutation(len(ids))]
    tables = root / f"tables-{m}"
    tables.mkdir()
    with (tables / "nodes.csv").open("w", newline="") as handle:
        rows = [["person", f"feature_{m}"], *[[i, str(m + len(i))] for i in ids]]
        csv.writer(handle).writerows(rows)
    with (tables / "edges.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([["a", "b"], *itertools.pairwise(ids)])
    with (tables / "labels.csv").open("w", newline="") as handle:
        labelled = [i for n, i in enumerate(sorted(ids)) if n % label_every == 0]
        csv.writer(handle).writerows(
            [["person", "y"], *[[i, str(int(i[-1]) % 2)] for i in labelled]]
        )
    out = root / f"party-{m}"
    code = main(["prepare", "--nodes", str(tables / "nodes.csv"), "--edges",
                 str(tables / "edges.csv"), "--labels", str(tables / "labels.csv"),
                 "--id-column", "person", "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    return out


def run_alignment(
    server: dict[str, str],
    root: Path,
    folders: list[Path],
    *,
    nodes: str = "intersection",
    party_args: Callable[[int], list[str]] = lambda m: [],
    codes_expected: dict[int, int] | None = None,
    create_args: Sequence[str] = (),
) -> str:
    """`glasu align create` (with ``create_args``) and every party's `glasu align run` (with
    ``party_args(m)``), in parallel; the alignment id."""
    connection = ["--server", server["url"]]
    alignment = root / "alignment"
    assert main(["align", "create", *connection, "--admin-token-file", server["token_file"],
                 "--parties", str(len(folders)), "--seed", "7", "--nodes", nodes,
                 "--out", str(alignment), *create_args]) == 0  # fmt: skip
    aid = (alignment / "alignment.id").read_text()
    assert (alignment / "party-0.token").stat().st_mode & 0o777 == 0o600
    codes: dict[int, int] = {}

    def run_party(m: int) -> None:
        codes[m] = main(["align", "run", *connection, "--alignment", aid, "--party", str(m),
                         "--token-file", str(alignment / f"party-{m}.token"),
                         "--data", str(folders[m]), "--quiet", *party_args(m)])  # fmt: skip

    threads = [threading.Thread(target=run_party, args=(m,)) for m in range(len(folders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert codes == (codes_expected or dict.fromkeys(range(len(folders)), 0))
    return aid


def test_three_parties_align_and_the_session_matches_their_folders(
    server: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folders = [prepared_party(tmp_path, m, label_every=2 if m == 2 else 1) for m in range(3)]
    connection = ["--server", server["url"]]
    aid = run_alignment(server, tmp_path, folders)
    captured = capsys.readouterr()
    assert "20 of its 30 nodes are shared by all 3 parties" in captured.out
    assert "warning: 10 of its aligned nodes have no label here" in captured.err  # party 2
    assert main(["align", "status", *connection, "--alignment", aid, "--token-file",
                 str(tmp_path / "alignment" / "party-1.token")]) == 0  # fmt: skip
    assert "done" in capsys.readouterr().out
    records = [json.loads((folder / "alignment.json").read_text()) for folder in folders]
    assert len({r["digest"] for r in records}) == 1 and {r["aligned_nodes"] for r in records} == {
        20
    }
    partitions = [load_partition(folder) for folder in folders[:2]]
    with pytest.raises(ValueError, match="no label for"):
        load_partition(folders[2])  # deployed, every party needs every shared node's label
    for part in partitions:
        assert part.num_nodes == 20 and part.clients == 3
        assert part.aligned_features().shape == (20, 1)
    # the same node at the same index: feature m + len(id) is len(id) at both, shifted by m
    np.testing.assert_array_equal(
        partitions[1].aligned_features() - 1, partitions[0].aligned_features()
    )
    np.testing.assert_array_equal(partitions[0].labels, partitions[1].labels)
    token = Path(server["token_file"]).read_text().strip()
    with AdminClient(base_url=server["url"], token=token) as admin:
        body = aligned_session_request(TrainConfig(), admin.alignment(aid))
    assert body["num_nodes"] == 20 and body["clients"] == 3
    assert decoded(body["train_nodes"]) == partitions[0].train_nodes.tolist()
    evaluated = sorted([*partitions[0].val_nodes, *partitions[0].test_nodes])
    assert decoded(body["eval_nodes"]) == evaluated
    out = tmp_path / "session"
    code = main(["session", "create", *connection, "--admin-token-file", server["token_file"],
                 "--alignment", aid, "--no-he", "--rounds", "2", "--out", str(out)])  # fmt: skip
    assert code == 0
    assert json.loads((out / "session.json").read_text())["clients"] == 3


def test_an_alignment_over_the_union_indexes_every_partys_nodes(
    server: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folders = [prepared_party(tmp_path, m) for m in range(3)]
    aid = run_alignment(server, tmp_path, folders, nodes="union")
    said = capsys.readouterr().out
    assert "its 30 nodes are among the 50 nodes of the union, 20 of them held by all 3" in said
    partitions = [load_partition(folder) for folder in folders]  # labels for its own nodes only
    held = np.stack([part.held for part in partitions])
    assert held.shape == (3, 50) and (held.sum(axis=1) == 30).all()
    assert (held.sum(axis=0) == 3).sum() == 20 and (held.sum(axis=0) >= 1).all()
    for m, part in enumerate(partitions):
        features = part.aligned_features()
        assert not features[~part.held].any()  # nothing where the party lacks the node
        np.testing.assert_array_equal(part.labels[~part.held], -1)
        assert part.held[part.edge_index.numpy()].all()
        if m:  # feature m + len(id): the same node at the same index at every party
            both = partitions[0].held & part.held
            np.testing.assert_array_equal(
                features[both] - m, partitions[0].aligned_features()[both]
            )
    token = Path(server["token_file"]).read_text().strip()
    with AdminClient(base_url=server["url"], token=token) as admin:
        status = admin.alignment(aid)
        body = aligned_session_request(TrainConfig(), status)
    assert (status["nodes"], status["aligned_nodes"], status["shared_nodes"]) == ("union", 50, 20)
    assert body["nodes"] == "union" and body["num_nodes"] == 50
    assert decoded(body["train_nodes"]) == partitions[0].train_nodes.tolist()


def test_signed_parties_align_and_a_set_from_the_wrong_peer_is_not_blinded(
    server: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folders = [prepared_party(tmp_path, m) for m in range(2)]
    keys = [tmp_path / f"keys-{m}" for m in range(2)]
    for folder in keys:
        assert main(["align", "keygen", "--out", str(folder)]) == 0
    assert (keys[0] / "alignment-signing.key").stat().st_mode & 0o777 == 0o600
    assert main(["align", "keygen", "--out", str(keys[0])]) == 2  # never overwrites a key

    def signed(m: int, peer: Path | None = None) -> list[str]:
        peer = peer or keys[1 - m] / "alignment-signing.pub"
        return ["--signing-key", str(keys[m] / "alignment-signing.key"),
                "--peer-key", f"{1 - m}={peer}", "--peer-wait-seconds", "3"]  # fmt: skip

    run_alignment(server, tmp_path, folders, party_args=signed)
    assert capsys.readouterr().out.count("20 of its 30 nodes are shared by all 2 parties") == 2
    # party 1 takes its own public key for party 0's: party 0's sets are not what it expects
    second = tmp_path / "second"
    second.mkdir()
    wrong = {1: keys[1] / "alignment-signing.pub"}
    run_alignment(server, second, folders, party_args=lambda m: signed(m, wrong.get(m)),
                  codes_expected={0: 5, 1: 1})  # fmt: skip
    assert "its signature is not party 0's" in capsys.readouterr().err
