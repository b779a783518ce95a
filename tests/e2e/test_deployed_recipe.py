"""The deployed flow takes the training recipe (real processes over loopback HTTP): the operator
runs `glasu session create --backbone sign` without the settings the recipe chooses, and each
organisation's `glasu worker`, given no backbone, trains the sign model with the printed
settings; a worker given another backbone refuses the session before it sends anything."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from clients.cli.main import main
from clients.local.processes import ManagedProcess, glasu_command, start_process, start_serve
from clients.local.session import worker_arguments
from models.artefact import load_model
from models.config import TrainConfig
from models.data.partition import save_partition
from models.layout import layout_federation

pytestmark = pytest.mark.e2e

# the worker-side settings of the run (the session's come from session create and its recipe)
CONFIG = TrainConfig(
    clients=2, rounds=4, eval_every=2, hidden=16, encryption="none", dp=False, seed=0,
    device="cpu", backbone="sign", hops=2,
)  # fmt: skip


def _worker(root: Path, url: str, client: int, *, backbone: tuple[str, ...] = ()) -> ManagedProcess:
    """``glasu worker`` for ``client``, with no --backbone unless ``backbone`` gives one."""
    args = worker_arguments(
        CONFIG, server=url, session_id=(root / "session" / "session.id").read_text(),
        client=client, token_file=root / "session" / f"client-{client}.token",
        data=root / "partitions" / f"client-{client}", result=root / f"client-{client}.json",
        secret_context=None, threads=1, passes_total=0,  # no DP: unused
    )  # fmt: skip
    at = args.index("--backbone")
    args = [*args[:at], *args[at + 2 :], *backbone, "--model-out", str(root / f"model-{client}")]
    return start_process(f"worker {client}", glasu_command(*args), root / f"worker-{client}.log")


@pytest.mark.slow  # over 15 s on 2 cores: the full run (README) has it
def test_the_workers_train_with_the_recipe_that_session_create_printed(
    tmp_path: Path,
    cora,
    data_dir: Path,
    processes: list[ManagedProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    served = start_serve(tmp_path, admin_token=secrets.token_urlsafe(32))
    processes.append(served.managed)
    served.wait_healthy()
    assert main(["session", "create", "--server", served.url, "--admin-token-file",
                 str(served.admin_token_file), "--dataset", "cora", "--data-dir", str(data_dir),
                 "--clients", "2", "--rounds", "4", "--eval-every", "2", "--hidden", "16",
                 "--no-dp", "--no-he", "--backbone", "sign",
                 "--out", str(tmp_path / "session")]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    labelled = cora.train_nodes.size
    assert f"--batch-size {labelled}" in printed and "--stale 1" in printed
    for part in layout_federation(CONFIG, cora).partitions:
        save_partition(part, tmp_path / "partitions")

    # a worker given another backbone than the session's refuses it (exit 1), naming both
    refused = _worker(tmp_path, served.url, 0, backbone=("--backbone", "gcnii"))
    processes.append(refused)
    assert refused.process.wait(timeout=600) == 1, refused.tail()
    assert "--backbone gcnii differs from the session's backbone sign" in refused.tail()

    workers = [_worker(tmp_path, served.url, m) for m in range(CONFIG.clients)]
    processes.extend(workers)
    for m, worker in enumerate(workers):
        assert worker.process.wait(timeout=600) == 0, worker.tail()
        assert f"glasu worker {m}: backbone sign (the session's), --hops 2" in worker.tail()
        manifest = load_model(tmp_path / f"model-{m}").manifest
        assert manifest["model"]["backbone"] == "sign" and manifest["model"]["hops"] == 2
        session = manifest["session_config"]
        assert (session["batch_size"], session["stale"], session["layers"]) == (labelled, 1, 1)
        assert [a["layer"] for a in session["agg_layers"]] == [1]
