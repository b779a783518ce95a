"""Two workers on one data folder: the second stops at once with one sentence, before it reads
anything (it would otherwise resume from the live worker's checkpoint)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clients.cli.errors import EXIT_FAILED
from clients.cli.main import main
from clients.data_lock import DataFolderLock

HOLD = (
    "import sys; from pathlib import Path; from clients.data_lock import DataFolderLock\n"
    "with DataFolderLock(Path(sys.argv[1])):\n"
    "    print('held', flush=True); sys.stdin.read()\n"
)


def worker_args(data: Path, token: Path) -> list[str]:
    return [
        "worker", "--server", "http://127.0.0.1:9", "--session", "s", "--client", "0",
        "--token-file", str(token), "--data", str(data), "--no-checkpoint",
    ]  # fmt: skip


def test_a_second_worker_on_the_same_data_folder_is_refused_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    token = tmp_path / "token"
    token.write_text("t" * 32)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert main(worker_args(data, token)) == EXIT_FAILED
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        assert f"pid {holder.pid}" in err and "one worker per folder" in err
    finally:
        holder.communicate("")
    # the holder is gone: the kernel released its lock, the folder can be taken again
    with DataFolderLock(data):
        pass
