"""One worker per data folder: the folder holds the worker's checkpoints, and a second worker on
it would "resume" from the live one's checkpoint. (The owner's ledger is the organisation's and
may be shared by workers on several folders at once: ``clients/owner_ledger.py`` makes that
safe.) An advisory ``flock`` on a file in the folder, released by the kernel when the process
ends, however it ends."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

LOCK_FILENAME = ".glasu-worker.lock"


class DataFolderBusy(RuntimeError):
    """Another process holds the data folder."""


class DataFolderLock:
    """Held from :meth:`acquire` (or ``__enter__``) to ``__exit__``; :class:`DataFolderBusy` if
    another process holds it."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_FILENAME
        self._fd: int | None = None

    def __enter__(self) -> DataFolderLock:
        if self._fd is None:
            self.acquire()
        return self

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise DataFolderBusy(
                f"another glasu worker (pid {holder}) is running on the data folder "
                f"{self.path.parent}: one worker per folder (its ledger and checkpoints are that "
                "worker's); stop it first, or give this worker its own folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None
