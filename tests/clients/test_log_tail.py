"""The log tail printed when a process of a federation fails (clients/local/processes.py)."""

from __future__ import annotations

from pathlib import Path

from clients.local.processes import log_tail


def test_the_tail_is_the_last_lines_of_the_log(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("".join(f"line {i}\n" for i in range(20)) + "failed: x\n\n")
    assert log_tail(log, 2) == "line 19\nfailed: x"
    assert log_tail(log).splitlines() == [*(f"line {i}" for i in range(6, 20)), "failed: x"]


def test_an_unreadable_log_has_an_empty_tail(tmp_path: Path) -> None:
    assert log_tail(tmp_path / "never-written.log") == ""
