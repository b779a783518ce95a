"""The deployed flow takes the training recipe (real processes over loopback HTTP): the operator
runs `glasu session create --backbone sign` without the settings the recipe chooses, and each
organisation's `glasu worker`, given none of them, trains the sign model with the printed
settings (the session's, and the session's defaults for the workers' own); a worker given
another backbone refuses the session before it sends anything, and its refusal at join closes
the session for its partners before any of them releases (the join gate)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from clients.cli.main import main
from clients.local.processes import ManagedProcess, glasu_command, start_process, start_serve
from clients.session_fit import session_defaultable
from models.artefact import load_model
from models.config import TrainConfig
from models.data.partition import save_partition
from models.layout import layout_federation
from models.recipe import choose_recipe

pytestmark = pytest.mark.e2e

CLIENTS = 2


def _worker(
    root: Path, url: str, client: int, *extra: str, session_dir: str = "session"
) -> ManagedProcess:
    """`glasu worker` for ``client`` of the session written to ``root / session_dir``, with only
    what a deployment must give it."""
    session = root / session_dir
    args = [
        "worker", "--server", url, "--session", (session / "session.id").read_text(),
        "--client", str(client), "--token-file", str(session / f"client-{client}.token"),
        "--data", str(root / "partitions" / f"client-{client}"), "--device", "cpu",
        "--threads", "1", "--no-require-dp", "--quiet",
        "--model-out", str(root / f"model-{client}"), *extra,
    ]  # fmt: skip
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

    def create_session(out: str) -> None:
        assert main(["session", "create", "--server", served.url, "--admin-token-file",
                     str(served.admin_token_file), "--dataset", "cora", "--data-dir",
                     str(data_dir), "--clients", str(CLIENTS), "--rounds", "4", "--eval-every",
                     "2", "--hidden", "16", "--no-dp", "--no-he", "--backbone", "sign",
                     "--out", str(tmp_path / out)]) == 0  # fmt: skip

    create_session("refused-session")
    printed = capsys.readouterr().out
    labelled = cora.train_nodes.size
    recipe = choose_recipe(backbone="sign", labelled=labelled)
    for choice in recipe.choices:
        assert f"{choice.flag} {choice.value}" in printed
    for_workers = {c.field: c.value for c in recipe.choices if c.field in session_defaultable()}
    layout = layout_federation(TrainConfig(clients=CLIENTS, seed=0), cora)
    for part in layout.partitions:
        save_partition(part, tmp_path / "partitions")

    # a worker given another backbone than the session's refuses it (exit 1), naming both; its
    # refusal at join closes the session, so its partner stops before any release (exit 3)
    refused = _worker(tmp_path, served.url, 0, "--backbone", "gcnii", session_dir="refused-session")
    processes.append(refused)
    assert refused.process.wait(timeout=600) == 1, refused.tail()
    assert "--backbone gcnii differs from the session's backbone sign" in refused.tail()
    partner = _worker(tmp_path, served.url, 1, session_dir="refused-session")
    processes.append(partner)
    assert partner.process.wait(timeout=600) == 3, partner.tail()
    assert "session-refused" in partner.tail() and "client 0 refused it" in partner.tail()

    create_session("session")
    workers = [_worker(tmp_path, served.url, m) for m in range(CLIENTS)]
    processes.extend(workers)
    for m, worker in enumerate(workers):
        assert worker.process.wait(timeout=600) == 0, worker.tail()
        said = worker.tail()
        assert f"glasu worker {m}: backbone sign (the session's)" in said
        for name, value in for_workers.items():
            assert f"--{name.replace('_', '-')} {value} (the session's)" in said
        manifest = load_model(tmp_path / f"model-{m}").manifest
        assert manifest["model"]["backbone"] == "sign"
        assert manifest["model"]["hops"] == for_workers.get("hops", manifest["model"]["hops"])
        session = manifest["session_config"]
        assert (session["batch_size"], session["stale"], session["layers"]) == (labelled, 1, 1)
        assert [a["layer"] for a in session["agg_layers"]] == [1]
