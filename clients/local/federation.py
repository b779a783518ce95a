"""``glasu train --transport http``: the service and one worker process per client on this
machine, over real HTTP on loopback. Every process started here is stopped here, whatever
happens."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from clients.admin import AdminClient, ServiceUnavailable
from clients.local.processes import (
    MAX_WORKER_RESTARTS,
    ManagedProcess,
    crashed,
    exit_failure,
    glasu_command,
    restart_process,
    secret_file,
    start_process,
    start_serve,
    stop_all,
)
from clients.local.run_summary import summary_from_workers
from clients.local.session import session_request, worker_arguments
from clients.owner_ledger import PartyLedgers
from models.config import TrainConfig
from models.data.partition import ClientPartition, save_partition
from models.data.planetoid import GraphDataset
from models.layout import FederationLayout
from models.run_summary import RunSummary


@dataclass
class LocalFederation:
    """The service of a local run on a free loopback port, its admin client, the CKKS keys
    (when encrypted) and every process started; see :func:`local_federation`."""

    root: Path
    url: str
    admin: AdminClient
    processes: list[ManagedProcess]
    secret_context: Path | None
    masking: list[list[str]] | None = None  # each worker's masking key arguments

    def start_workers(
        self,
        config: TrainConfig,
        partitions: Sequence[ClientPartition],
        created: dict[str, Any],
        *,
        threads: int,
        extra: Callable[[int], list[str]] = lambda client: [],
        folders: Sequence[Path] | None = None,
        ledgers: PartyLedgers | None = None,
    ) -> None:
        """One ``glasu worker`` per partition, ``extra(m)`` appended to client m's arguments;
        each reads its folder in ``folders`` or, by default, its partition written here, and
        writes its organisation's ledger in ``ledgers`` or, by default (synthetic parties of a
        benchmark dataset), one beside that partition, the run's own."""
        for part, token in zip(partitions, created["client_tokens"], strict=True):
            if folders is not None:
                data = folders[part.client]
            else:
                data = save_partition(part, self.root / "partitions")
            args = worker_arguments(
                config,
                server=self.url,
                session_id=created["session_id"],
                client=part.client,
                token_file=secret_file(self.root / f"client-{part.client}.token", token),
                data=data,
                result=self.result_path(part.client),
                secret_context=self.secret_context,
                threads=threads,
                passes_total=created["passes_total"],
                max_lifetime_epsilon=None if ledgers is None else ledgers.max_lifetime_epsilon,
            )
            if ledgers is not None:
                args += ["--ledger", str(ledgers.paths[part.client])]
            if self.masking is not None:
                args += self.masking[part.client]
            self.processes.append(
                start_process(
                    f"worker {part.client}",
                    glasu_command(*args, *extra(part.client)),
                    self.root / f"client-{part.client}.log",
                )
            )

    def result_path(self, client: int) -> Path:
        return self.root / f"client-{client}.json"

    def results(self, clients: int) -> list[dict[str, Any]]:
        return [json.loads(self.result_path(m).read_text()) for m in range(clients)]


@contextmanager
def local_federation(
    *,
    encrypted: bool,
    work_dir: Path | None = None,
    serve_args: Sequence[str] = (),
    masked_clients: int | None = None,
) -> Iterator[LocalFederation]:
    """Start ``glasu serve`` on loopback (with a fresh CKKS key pair when ``encrypted``, and
    ``serve_args`` as more options) in ``work_dir`` (default: a temporary folder); every process
    started is stopped on the way out, whatever happens. With ``masked_clients`` (M), the
    workers mask their shares: a fresh shared BFV key instead of the CKKS one (the service
    needs none) and a fresh masking key pair per client."""
    with ExitStack() as stack:
        # A process that is still writing its log while the directory goes must not turn an
        # interrupted run into an OSError.
        root = work_dir or Path(
            stack.enter_context(
                tempfile.TemporaryDirectory(prefix="glasu-", ignore_cleanup_errors=True)
            )
        )
        processes: list[ManagedProcess] = []
        stack.callback(stop_all, processes)
        extra_args: list[str] = list(serve_args)
        secret_context, masking = None, None
        if masked_clients is not None:
            from clients.local.session import masking_arguments
            from secure.masking.codec import generate_bfv_keys

            secret_context, _ = generate_bfv_keys(root / "keys")
            masking = masking_arguments(root / "masking", masked_clients)
        elif encrypted:
            from secure.ckks import generate_keys

            secret_context, public_context = generate_keys(root / "keys")
            extra_args += ["--public-context", str(public_context)]
        service = start_serve(root, admin_token=secrets.token_urlsafe(32), extra_args=extra_args)
        processes.append(service.managed)
        admin = stack.enter_context(AdminClient(base_url=service.url, token=service.admin_token))
        service.wait_healthy()
        yield LocalFederation(root, service.url, admin, processes, secret_context, masking)


def train_over_http(
    config: TrainConfig,
    layout: FederationLayout,
    dataset: GraphDataset,
    *,
    threads: int = 1,
    progress: bool = True,
    work_dir: Path | None = None,
    model_dirs: Sequence[Path] | None = None,
    about: Mapping[str, Any] | None = None,
    folders: Sequence[Path] | None = None,
    ledgers: PartyLedgers | None = None,
) -> RunSummary:
    """``model_dirs``: one folder per client, where its worker keeps its trained model;
    ``about``: the session body's ``partners`` and ``operator``; ``folders``: the workers'
    data folders (``clients.local.parties.worker_folders``), instead of the layout's partitions
    written to the work folder; ``ledgers``: each organisation's own privacy ledger (default:
    the run's own, for the synthetic parties of a benchmark dataset)."""
    if len(layout.groups) != 1:
        raise ValueError(
            "this mode trains clients independently; run it with "
            "--transport inprocess (it sends nothing)"
        )
    started = time.perf_counter()
    masked = len(layout.partitions) if config.masked else None
    with local_federation(
        encrypted=config.encrypted, work_dir=work_dir, masked_clients=masked
    ) as fed:
        body = {**session_request(config, layout, dataset), **(about or {}), "ready_gate": True}
        created = fed.admin.create_session(body)
        fed.start_workers(
            config,
            layout.partitions,
            created,
            threads=threads,
            extra=lambda m: [] if model_dirs is None else _keeping_model(model_dirs[m]),
            folders=folders,
            ledgers=ledgers,
        )
        follow(fed.admin, created["session_id"], fed.processes, created["passes_total"], progress)
        results = fed.results(len(layout.partitions))
        privacy = fed.admin.privacy(created["session_id"])
    return summary_from_workers(
        config, layout, dataset, results, privacy, wall_seconds=time.perf_counter() - started
    )


def _keeping_model(folder: Path) -> list[str]:
    """The worker flags that keep a client's model in ``folder``; ``--overwrite`` because the
    command that asked for it (``glasu train --model-dir``) has already refused an existing
    model unless its own ``--overwrite`` was given."""
    return ["--model-out", str(folder), "--overwrite"]


def follow(
    admin: AdminClient,
    session_id: str,
    processes: Sequence[ManagedProcess],
    passes_total: int,
    progress: bool,
) -> dict[str, Any]:
    """Show one progress bar for the whole federation until every worker has exited; fail fast
    (naming the process) when any process dies with an error. A worker that crashed (killed,
    say by the kernel) is started again, up to ``MAX_WORKER_RESTARTS`` times: it resumes from
    its checkpoint and rejoins the pass the service is at."""
    workers = processes[1:]
    bar = tqdm(
        total=passes_total, desc="federation", unit="pass", disable=not progress, leave=False
    )
    status: dict[str, Any] = {}
    postfix: dict[str, Any] = {}

    def check_processes() -> None:
        for managed in processes:
            code = managed.process.poll()
            restartable = (
                managed is not processes[0]
                and bool(managed.command)
                and managed.restarts < MAX_WORKER_RESTARTS
            )
            if restartable and crashed(code):
                restart_process(managed)
                tqdm.write(
                    f"{managed.name} crashed (exit code {code}); restarted it "
                    f"({managed.restarts} of {MAX_WORKER_RESTARTS}): it resumes from its "
                    "checkpoint",
                    file=sys.stderr,
                )
                postfix["restarts"] = sum(w.restarts for w in workers)
                bar.set_postfix(postfix)
                continue
            if code not in (None, 0) or (managed is processes[0] and code is not None):
                raise exit_failure(managed, code)

    try:
        while True:
            check_processes()
            try:
                status = admin.session(session_id)
            except ServiceUnavailable:
                # The service may have stopped between the check and the call (it is the first
                # to go when Ctrl-C reaches the process group): name it rather than the symptom.
                with suppress(subprocess.TimeoutExpired):
                    processes[0].process.wait(timeout=1.0)
                check_processes()
                raise
            bar.update(max(0, min(status["current_pass"], passes_total) - bar.n))
            evals = [m for m in status.get("metrics", []) if m.get("val_accuracy") is not None]
            if evals:
                postfix.update(round=evals[-1]["round"], val=f"{evals[-1]['val_accuracy']:.3f}")
                bar.set_postfix(postfix)
            if all(w.process.poll() == 0 for w in workers):
                return status
            time.sleep(0.3)
    finally:
        bar.close()
