"""A throwaway PostgreSQL cluster for the tests and the benchmarks.

:meth:`PostgresCluster.start` runs ``initdb`` in a folder, starts the server on a free loopback
port with trust authentication (loopback only, nothing else listens) and creates a database
``glasu``; :meth:`PostgresCluster.new_database` gives each test its own database; ``stop``
(or leaving the ``with`` block) stops the server. The binaries come from PATH or Debian's
``postgresql`` package (``/usr/lib/postgresql/<version>/bin``). ``initdb`` refuses to run as
root, so as root the server runs as the ``postgres`` user on a folder chowned to it.

    with PostgresCluster.start(Path("/tmp/pg")) as cluster:
        url = cluster.new_database("scratch")   # postgresql://postgres@127.0.0.1:PORT/scratch
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path
from types import TracebackType

from clients.local.processes import free_port

SERVER_USER = "postgres"  # the server's OS user when we are root
DATABASE = "glasu"


def postgres_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: PATH's, else the newest Debian one."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).resolve().parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for folder in reversed(versions):
        if (folder / "pg_ctl").is_file() and (folder / "initdb").is_file():
            return folder
    return None


class PostgresCluster:
    def __init__(self, root: Path, binaries: Path, port: int) -> None:
        self.root = root
        self.binaries = binaries
        self.port = port
        self.data = root / "data"

    @classmethod
    def start(cls, root: Path) -> PostgresCluster:
        binaries = postgres_binaries()
        if binaries is None:
            raise FileNotFoundError(
                "PostgreSQL is not installed (no initdb/pg_ctl on PATH or in"
                " /usr/lib/postgresql/*/bin): apt-get install postgresql"
            )
        root.mkdir(parents=True, exist_ok=True)
        cluster = cls(root, binaries, free_port())
        cluster._init()
        cluster._run_server()
        cluster._psql("postgres", f"CREATE DATABASE {DATABASE}")
        return cluster

    @property
    def url(self) -> str:
        return self.url_of(DATABASE)

    def url_of(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self, name: str) -> str:
        """Create database ``name`` (letters, digits and underscores) and return its URL."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a plain database name: {name!r}")
        self._psql("postgres", f"CREATE DATABASE {name}")
        return self.url_of(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._as_server(
                [str(self.binaries / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                check=False,
            )

    def __enter__(self) -> PostgresCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _init(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            server = pwd.getpwnam(SERVER_USER)
            for path in (self.root, self.data):
                os.chown(path, server.pw_uid, server.pw_gid)
        self._as_server(
            [
                str(self.binaries / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            ]
        )

    def _run_server(self) -> None:
        # fsync stays on: the tests check what the store asks of the server, not disk speed.
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -k {self.data}"
            " -c max_connections=400"
        )
        self._as_server(
            [
                str(self.binaries / "pg_ctl"),
                "-D",
                str(self.data),
                "-o",
                options,
                "-l",
                str(self.data / "server.log"),
                "-w",
                "-t",
                "60",
                "start",
            ]
        )

    def _psql(self, database: str, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.url_of(database), autocommit=True) as connection:
            connection.execute(statement)  # type: ignore[arg-type]

    def _as_server(self, command: list[str], *, check: bool = True) -> None:
        if os.geteuid() == 0:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, cwd=self.root)
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{Path(command[-1]).name if len(command) == 1 else ' '.join(command[:4])}"
                f" failed ({result.returncode}): {result.stderr.strip() or result.stdout.strip()}"
            )
