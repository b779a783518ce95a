"""Nothing replaced silently: `glasu worker --model-out/--predictions`, `glasu train --model-dir`
and `glasu score --out` refuse an existing artefact without --overwrite, and a model folder
holding another party's model always, before any work or release (the commands' `main` with
real files; what runs after the checks is replaced by a recorder, or fails on purpose)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.cli import score_cmd, train_cmd
from clients.cli.errors import EXIT_FAILED, EXIT_USAGE
from clients.cli.main import main
from models.artefact import CLAIM, MANIFEST, save_model


def keep_model(folder: Path, *, party: int, parties: int = 3) -> Path:
    """A model folder as a worker leaves it (manifest and weights), of party ``party``."""
    return save_model(
        folder,
        manifest={"session_id": "trained", "party": {"index": party, "parties": parties}},
        weights={},
    )


def worker(tmp_path: Path, client: int, *extra: str) -> int:
    """`glasu worker` for client ``client`` against a service that is never reached: its data
    folder does not exist, so a worker past its output checks stops at the data (exit 1)."""
    token = tmp_path / "token"
    token.write_text("t\n")
    return main(
        ["worker", "--server", "http://127.0.0.1:9", "--session", "s", "--client", str(client),
         "--token-file", str(token), "--data", str(tmp_path / "no-data"), "--no-checkpoint",
         "--ledger", str(tmp_path / "ledger.sqlite3"), *extra]
    )  # fmt: skip


def test_worker_refuses_its_own_existing_model_without_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = keep_model(tmp_path / "models" / "bank", party=1)
    before = (folder / MANIFEST).read_bytes()
    assert worker(tmp_path, 1, "--model-out", str(folder)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"error: --model-out {folder} exists; pass --overwrite to replace it" in err
    assert (folder / MANIFEST).read_bytes() == before and not (folder / CLAIM).exists()
    assert not (tmp_path / "ledger.sqlite3").exists()  # nothing released, nothing counted
    # with --overwrite it goes on (and stops at the missing data folder)
    assert worker(tmp_path, 1, "--model-out", str(folder), "--overwrite") == EXIT_FAILED
    assert "--data" in capsys.readouterr().err


def test_worker_never_writes_into_another_partys_model_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = keep_model(tmp_path / "models", party=0)
    assert worker(tmp_path, 2, "--model-out", str(folder), "--overwrite") == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--model-out {folder} holds the model of party 0, not of this party (2)" in err
    assert json.loads((folder / MANIFEST).read_text())["party"]["index"] == 0
    assert not (folder / CLAIM).exists()


def test_three_workers_on_one_model_folder_the_first_claims_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's three workers given `--model-out models`: the first to start claims the folder
    for its party, the others are refused by name before they release anything."""
    folder = tmp_path / "models"
    assert worker(tmp_path, 0, "--model-out", str(folder)) == EXIT_FAILED  # claimed, then no data
    assert json.loads((folder / CLAIM).read_text())["party"] == 0
    capsys.readouterr()
    for client in (1, 2):
        assert worker(tmp_path, client, "--model-out", str(folder), "--overwrite") == EXIT_USAGE
        assert f"holds the model of party 0, not of this party ({client})" in (
            capsys.readouterr().err
        )
    # the first party started again (resuming) is still welcome in its own folder
    assert worker(tmp_path, 0, "--model-out", str(folder)) == EXIT_FAILED


def test_worker_refuses_a_folder_of_other_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert worker(tmp_path, 0, "--model-out", str(tmp_path), "--overwrite") == EXIT_USAGE
    assert "holds other files than a glasu model" in capsys.readouterr().err
    assert not (tmp_path / CLAIM).exists()


def test_worker_refuses_existing_predictions_without_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    predictions = tmp_path / "bank.csv"
    predictions.write_text("id,class\n")
    model = keep_model(tmp_path / "model", party=0)
    given = ("--model", str(model), "--predictions", str(predictions))
    assert worker(tmp_path, 0, *given) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"error: --predictions {predictions} exists; pass --overwrite to replace it" in err
    assert predictions.read_text() == "id,class\n"
    assert not (tmp_path / "ledger.sqlite3").exists()
    assert worker(tmp_path, 0, *given, "--overwrite") == EXIT_FAILED  # past the check


def test_train_refuses_existing_models_in_model_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[object] = []
    monkeypatch.setattr(train_cmd, "run", lambda args: started.append(args) or 0)
    models = tmp_path / "models"
    keep_model(models / "client-1", party=1, parties=2)
    argv = ["train", "--clients", "2", "--model-dir", str(models)]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--model-dir {models / 'client-1'} exists; pass --overwrite to replace it" in err
    assert not started
    assert main([*argv, "--overwrite"]) == 0 and len(started) == 1
    # another party's model where this party's goes: refused even with --overwrite
    keep_model(models / "client-0", party=1, parties=2)
    assert main([*argv, "--overwrite"]) == EXIT_USAGE
    assert "holds the model of party 1, not of this party (0)" in capsys.readouterr().err
    assert len(started) == 1


def test_score_refuses_existing_predictions_before_aligning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scored: list[object] = []  # the alignment, the service, the releases: after the checks
    monkeypatch.setattr(score_cmd, "run", lambda args: scored.append(args) or 0)
    parties = [tmp_path / name for name in ("bank", "insurer")]
    for folder in parties:
        folder.mkdir()
    (tmp_path / "models").mkdir()
    out = tmp_path / "predictions"
    out.mkdir()
    (out / "insurer.csv").write_text("kept\n")
    argv = ["score", "--party", str(parties[0]), "--party", str(parties[1]),
            "--model-dir", str(tmp_path / "models"), "--out", str(out)]  # fmt: skip
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--out {out / 'insurer.csv'} exists; pass --overwrite to replace it" in err
    assert (out / "insurer.csv").read_text() == "kept\n" and not scored
    assert main([*argv, "--overwrite"]) == 0 and len(scored) == 1


def test_an_online_workers_predictions_folder_may_exist_but_not_be_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An online worker restarted on its predictions folder (one file per request) goes on; a
    file given as that folder is refused before any work."""
    folder = tmp_path / "answers"
    folder.mkdir()
    assert worker(tmp_path, 0, "--online", "--predictions", str(folder)) == EXIT_FAILED
    assert "--data" in capsys.readouterr().err  # past the output checks, stopped at the data
    answers = tmp_path / "answers.csv"
    answers.write_text("id\n")
    assert worker(tmp_path, 0, "--online", "--predictions", str(answers)) == EXIT_USAGE
    assert "with --online it is a folder" in capsys.readouterr().err
    assert answers.read_text() == "id\n"
