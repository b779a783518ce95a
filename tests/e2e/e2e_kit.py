"""``glasu train``'s processes (clients/local/federation.py) started by a test itself: a service
on a free loopback port and one ``glasu worker`` per party, so that the test can kill, freeze or
restart any of them."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients.admin import AdminClient
from clients.cli.keyfiles import read_masking_key_pair, read_pinned_masking_keys
from clients.cli.options import write_private_file
from clients.local.processes import (
    ManagedProcess,
    glasu_command,
    secret_file,
    start_process,
    start_serve,
)
from clients.local.session import session_request, worker_arguments
from models.config import TrainConfig
from models.data.partition import save_partition
from models.layout import layout_federation
from secure.masking.keys import PRIVATE_KEY_FILE, PUBLIC_KEY_FILE, MaskingKeyPair, PinnedPeerKeys


@dataclass
class Federation:
    service: ManagedProcess
    workers: list[ManagedProcess]
    admin: AdminClient
    session_id: str
    passes_total: int
    root: Path


def start_federation(
    config: TrainConfig,
    dataset,
    root: Path,
    processes: list[ManagedProcess],
    *,
    service_command: Callable[..., list[str]] = glasu_command,
    port: int | None = None,
    server_for: Callable[[int, str], str] = lambda client, url: url,
    extra: Callable[[int], list[str]] = lambda client: [],
) -> Federation:
    """Start the service (``service_command(*serve arguments)``) on ``port`` (default: a free
    one), create the session and start the workers, client m talking to ``server_for(m, service
    URL)`` (a proxy, say) with ``extra(m)`` appended to its arguments; every process is
    appended to ``processes`` as soon as it runs."""
    layout = layout_federation(config, dataset)
    served = start_serve(
        root, admin_token=secrets.token_urlsafe(32), command=service_command, port=port
    )
    service, url = served.managed, served.url
    processes.append(service)
    admin = AdminClient(base_url=url, token=served.admin_token)
    served.wait_healthy()
    created = admin.create_session(session_request(config, layout, dataset))
    workers = []
    for part, token in zip(layout.partitions, created["client_tokens"], strict=True):
        args = worker_arguments(
            config,
            server=server_for(part.client, url),
            session_id=created["session_id"],
            client=part.client,
            token_file=secret_file(root / f"client-{part.client}.token", token),
            data=save_partition(part, root / "partitions"),
            result=root / f"client-{part.client}.json",
            secret_context=None,
            threads=1,
            passes_total=created["passes_total"],
        )
        worker = start_process(
            f"worker {part.client}",
            glasu_command(*args, *extra(part.client)),
            root / f"client-{part.client}.log",
        )
        workers.append(worker)
        processes.append(worker)
    return Federation(service, workers, admin, created["session_id"], created["passes_total"], root)


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(np.ravel(a), np.ravel(b))[0, 1])


def fixed_masking_keys(root: Path, clients: int) -> list[list[str]]:
    """Masking key files from fixed bytes (deterministic masks) and each worker's arguments."""
    folders = [root / f"masking-{m}" for m in range(clients)]
    for m, folder in enumerate(folders):
        pair = MaskingKeyPair.from_private_bytes(bytes([41 + m]) * 32)
        folder.mkdir(parents=True)
        write_private_file(folder / PRIVATE_KEY_FILE, pair.private_bytes().reveal().hex())
        (folder / PUBLIC_KEY_FILE).write_text(pair.public_bytes().hex() + "\n")
    return [
        [
            "--masking-key",
            str(folders[m] / PRIVATE_KEY_FILE),
            "--masking-peer-keys",
            ",".join(f"{j}={f / PUBLIC_KEY_FILE}" for j, f in enumerate(folders) if j != m),
        ]
        for m in range(clients)
    ]


def masking_keys_of(arguments: list[str]) -> tuple[MaskingKeyPair, PinnedPeerKeys]:
    """A worker's key material, read from the key files of its :func:`fixed_masking_keys`
    arguments as the worker reads it."""
    own = read_masking_key_pair(Path(arguments[1]), "--masking-key")
    pins = [(int(a), Path(b)) for a, b in (i.split("=") for i in arguments[3].split(","))]
    return own, read_pinned_masking_keys(pins, "--masking-peer-keys")
