"""``glasu worker``: one organisation's process.

Exit codes: 0 the session finished (or the session's privacy budget was spent: said on stderr),
2 bad settings, 1 unusable data, key files or checkpoint (another session's, damaged) or an
answer that breaks the protocol, 3 the service refused a call (the problem detail as one
sentence), 4 the service stayed unreachable after bounded retries, 5 other clients did not
deliver their part of a step within --peer-wait-seconds, 6 this organisation's privacy policy
refused the session, or its budget
(per session or lifetime, counted in the organisation's ledger: --ledger) is spent. After every
pass the worker writes a checkpoint (--checkpoint DIR, default checkpoints/ in the data folder);
the same command run again after a crash resumes from it (docs/deploy.md, "Crashes and
resuming"). The parser needs only the settings model; torch and the models are imported when
the worker runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clients.cli.connection import read_token
from clients.cli.errors import (
    EXIT_PEERS_MISSING,
    EXIT_POLICY,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    CliError,
    UsageError,
    failing_as,
)
from clients.cli.options import (
    add_command,
    check_device,
    check_model_folder,
    check_output_file,
    ledger_errors,
)
from clients.cli.settings_args import add_settings_arguments, settings_from_args
from clients.settings import WorkerSettings
from models.config import PRECOMPUTED_BACKBONES

if TYPE_CHECKING:
    import torch

    from clients.predictions import IdsByNode, PredictionWriter
    from clients.request_signing import RequestCheck
    from clients.service_http import KeptTransport
    from clients.session_fit import LocalModelOptions
    from models.artefact import SavedModel
    from models.data.partition import ClientPartition
    from models.outcome import PassOutcome
    from secure.aggregation import EmbeddingCodec
    from secure.wire.passes import PassInfo


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "worker",
        help="run one client against the aggregation service",
        description="One organisation's worker: loads only its own partition and follows the "
        "session's passes. Every flag can also be given as an environment variable "
        "GLASU_<FLAG>, or in a TOML --settings-file (a flag wins over its variable, a variable "
        "over the file). The privacy policy settings are the data owner's: the worker refuses "
        "a session that would spend more. The session names the backbone (a worker given "
        "another refuses it) and may carry defaults for the local model's settings that the "
        "operator's recipe chose (--hops, --lr): the settings given here win over them.",
    )
    add_settings_arguments(p, WorkerSettings, skip=frozenset({"checkpoint", "no_checkpoint"}))
    p.add_argument(
        "--checkpoint",
        dest="checkpoint",
        default=None,
        metavar="DIR",
        help="folder of this worker's checkpoints, written after every pass; started again "
        "with the same command after a crash, the worker resumes from its checkpoint and "
        "rejoins the session [env GLASU_CHECKPOINT] (default: checkpoints/ in the --data "
        "folder)",
    )
    p.add_argument(
        "--no-checkpoint",
        dest="no_checkpoint",
        action="store_const",
        const=True,
        default=None,
        help="write no checkpoints (a worker that stops cannot rejoin its session) "
        "[env GLASU_NO_CHECKPOINT]",
    )
    p.add_argument("--quiet", action="store_true", help="no per-pass progress lines")
    return p


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(WorkerSettings, args)
    check_device(settings.device)  # before the data: a missing GPU is a bad setting (exit 2)
    claim_outputs(settings)
    from clients.data_lock import DataFolderBusy, DataFolderLock

    # first of all: a second worker on this folder would resume from the live one's checkpoint
    folder_lock = DataFolderLock(settings.data)
    try:
        folder_lock.acquire()
    except (DataFolderBusy, OSError) as exc:
        raise CliError(f"--data: {exc}") from exc
    with folder_lock:
        return _run(settings, ledger_path(settings), quiet=args.quiet)


def claim_outputs(settings: WorkerSettings) -> None:
    """``--predictions`` and ``--model-out``, before anything is read or released: an existing
    one is refused without ``--overwrite`` (an online worker's ``--predictions`` is a folder
    that may exist: a restarted worker goes on writing a file per request into it), another
    party's model folder always; the model folder is then claimed for this party (a second
    worker started on it is refused)."""
    from models.artefact import ModelError, claim_model_folder

    if not settings.online:
        check_output_file(settings.predictions, "--predictions", overwrite=settings.overwrite)
    elif settings.predictions is not None and settings.predictions.is_file():
        # online: a folder of one file per request session, whose ids never repeat
        raise UsageError(
            f"--predictions {settings.predictions} is a file; with --online it is a folder "
            "(one file per request)"
        )
    if settings.model_out is None:
        return
    check_model_folder(
        settings.model_out, "--model-out", party=settings.client, overwrite=settings.overwrite
    )
    try:
        claim_model_folder(settings.model_out, party=settings.client, session_id=settings.session)
    except ModelError as exc:
        raise UsageError(f"--model-out: {exc}") from None


def worker_codec(settings: WorkerSettings, *, parties: int) -> EmbeddingCodec:
    """How this worker's shares travel: plaintext, CKKS (``--secret-context``), or masked
    under BFV (``--masking-key``: with the BFV ``--secret-context`` and the peers' pinned
    ``--masking-peer-keys``)."""
    from secure.ckks import make_codec

    if settings.masking_key is None:
        if settings.masking_peer_keys is not None:
            raise CliError("--masking-peer-keys pins the peers' masking keys: give --masking-key")
        with failing_as("cannot load the secret context"):
            return make_codec(settings.secret_context)
    from clients.cli.keyfiles import read_masking_key_pair, read_pinned_masking_keys
    from secure.masking.codec import MaskedBfvCodec, load_bfv_secret_context

    if settings.secret_context is None:
        raise CliError(
            "--masking-key needs --secret-context: the shared BFV key of `glasu keygen --scheme "
            "bfv`"
        )
    with failing_as("cannot load the secret context"):
        context = load_bfv_secret_context(settings.secret_context)
    own = read_masking_key_pair(settings.masking_key, "--masking-key")
    peers = read_pinned_masking_keys(settings.pinned_masking_keys(), "--masking-peer-keys")
    with failing_as("--masking-peer-keys"):
        return MaskedBfvCodec.from_keys(
            context, own, peers, party=settings.client, parties=parties,
            session_id=settings.session,
        )  # fmt: skip


def ledger_path(settings: WorkerSettings) -> Path:
    """The organisation's ledger this worker writes (``--ledger``, or the data's default)."""
    from clients.owner_ledger import ledger_location

    with ledger_errors():
        return ledger_location(settings.data, ledger=settings.ledger)


@dataclass(frozen=True)
class LoadedWorker:
    """What a worker loads once: its token, partition, own ids, model, device, codec and TLS
    settings; an online worker (``--online``) keeps them for every request it scores."""

    token: str
    partition: ClientPartition
    ids_of_node: IdsByNode
    alignment_digest: str | None
    model: SavedModel | None
    device: torch.device
    codec: EmbeddingCodec
    verify: Any
    options: LocalModelOptions
    given: frozenset[str]
    # an online worker's one transport for all its request sessions (None: a fresh one each)
    transport: KeptTransport | None = None


def load_worker(settings: WorkerSettings) -> LoadedWorker:
    import torch

    from clients.predictions import ids_by_aligned_node
    from clients.service_http import tls_verification
    from clients.session_fit import LocalModelOptions
    from models.artefact import ModelError, load_model
    from models.data.partition import load_partition
    from models.device import resolve_device

    torch.set_num_threads(settings.torch_threads())
    token = read_token(settings.token_file, flag="--token-file")
    with failing_as(f"cannot load the partition {settings.data}"):
        partition = load_partition(settings.data, require_labels=False)
        ids_of_node, alignment_digest = ids_by_aligned_node(settings.data)
    model = None
    if settings.model is not None:
        with failing_as("--model", ModelError):
            model = load_model(settings.model)
    with failing_as("--device", RuntimeError, ValueError):
        device = resolve_device(settings.device)
    codec = worker_codec(settings, parties=partition.clients)
    with failing_as("--ca-file"):
        verify = tls_verification(settings.ca_file)
    # each of the local model's options is the worker setting of the same name
    local_fields = {field.name for field in dataclasses.fields(LocalModelOptions)}
    return LoadedWorker(
        token=token,
        partition=partition,
        ids_of_node=ids_of_node,
        alignment_digest=alignment_digest,
        model=model,
        device=device,
        codec=codec,
        verify=verify,
        options=LocalModelOptions(**settings.model_dump(include=local_fields)),
        given=frozenset(settings.model_fields_set & local_fields),  # flag, variable or file
    )


def _run(settings: WorkerSettings, ledger_file: Path, *, quiet: bool) -> int:
    if settings.online:
        from clients.cli.keyfiles import online_request_check
        from clients.cli.worker_online import serve_requests
        from clients.service_http import KeptTransport

        check = online_request_check(settings)
        loaded = load_worker(settings)
        transport = KeptTransport(loaded.verify)
        loaded = dataclasses.replace(loaded, transport=transport)
        try:
            return serve_requests(
                settings,
                loaded,
                lambda each: run_session(
                    each, loaded, ledger_file, quiet=quiet, request_check=check
                ),
            )
        finally:
            transport.shut()
    return run_session(settings, load_worker(settings), ledger_file, quiet=quiet)


def run_session(
    settings: WorkerSettings,
    loaded: LoadedWorker,
    ledger_file: Path,
    *,
    quiet: bool,
    request_check: RequestCheck | None = None,
) -> int:
    """Take part in ``settings.session`` with what ``loaded`` holds (a request session of an
    online session: checked by ``request_check`` at join): the worker's exit code. Its
    predictions file appears only once the session finished; a session it did not finish
    (refused, failed) leaves the rows scored so far in ``<file>.partial``, or nothing where none
    was scored (a request refused at join)."""
    from clients.predictions import PredictionWriter
    from models.artefact import class_names

    writer = None
    if settings.predictions is not None:
        with failing_as("--predictions", ValueError, OSError):
            if loaded.model is None:
                raise ValueError("predictions come from a scoring session: give --model DIR")
            writer = PredictionWriter(
                settings.predictions,
                ids_of_node=loaded.ids_of_node,
                num_classes=loaded.model.manifest["model"]["num_classes"],
                class_names=class_names(loaded.model.manifest),
            )
    try:
        return _take_part(
            settings, loaded, ledger_file, writer, quiet=quiet, request_check=request_check
        )
    finally:
        if writer is not None:
            writer.abandon()  # nothing once finished


def _take_part(
    settings: WorkerSettings,
    loaded: LoadedWorker,
    ledger_file: Path,
    writer: PredictionWriter | None,
    *,
    quiet: bool,
    request_check: RequestCheck | None,
) -> int:
    from pydantic import ValidationError

    from clients.checkpoint import CheckpointError, CheckpointStore
    from clients.owner_ledger import OwnerLedger
    from clients.policy import PolicyRefusal
    from clients.request_signing import RequestRefused
    from clients.service_http import (
        ConnectionOptions,
        PeersMissing,
        ServiceError,
        ServiceUnavailable,
    )
    from clients.session_client import SessionClient
    from clients.session_fit import SessionMismatch
    from clients.worker import WorkerRun
    from models.artefact import ModelError
    from secure.aggregation import PayloadError
    from secure.noise import NotPrivateNoiseError
    from secure.protocol import ProtocolViolation

    model, given = loaded.model, loaded.given

    def progress(info: PassInfo, outcome: PassOutcome) -> None:
        if writer is not None and outcome.answer is not None:  # the model's, one per customer
            writer.write(info.output_nodes, outcome.answer.probabilities)
        if not quiet and outcome.kind == "eval":
            print(evaluation_line(settings.client, info.round, outcome), flush=True)

    def resumed(pass_index: int, path) -> None:
        print(
            f"glasu worker {settings.client}: resumed from pass {pass_index} (checkpoint {path})",
            file=sys.stderr,
            flush=True,
        )

    directory = settings.checkpoint_dir()
    checkpoints = (
        None
        if directory is None
        else CheckpointStore(directory, session_id=settings.session, client=settings.client)
    )
    with (
        SessionClient(
            base_url=settings.server,
            session_id=settings.session,
            client_index=settings.client,
            token=loaded.token,
            options=ConnectionOptions(
                transport=loaded.transport,
                verify=loaded.verify,
                peer_wait_seconds=settings.peer_wait_seconds,
                poll_seconds=settings.poll_seconds,
            ),
        ) as service,
        OwnerLedger(ledger_file) as ledger,
    ):
        try:
            run = WorkerRun(
                service,
                loaded.partition,
                options=loaded.options,
                codec=loaded.codec,
                policy=settings.policy(),
                ledger=ledger,
                device=loaded.device,
                on_pass=progress,
                checkpoints=checkpoints,
                on_resume=resumed,
                model=model,
                model_out=settings.model_out,
                alignment_digest=loaded.alignment_digest,
                given_options=given,
                writes_predictions=writer is not None,
                request_check=request_check,
                ids_of_node=loaded.ids_of_node,
            )
            print(
                settings_line(settings.client, run.options, run.config.model_dump(), given=given),
                file=sys.stderr,
                flush=True,
            )
            result = run.run()
        except CheckpointError as exc:
            raise CliError(f"checkpoint: {exc}") from exc
        except ModelError as exc:
            raise CliError(f"--model: {exc}") from exc
        except SessionMismatch as exc:
            raise CliError(f"cannot take part in session {settings.session}: {exc}") from exc
        except (PolicyRefusal, NotPrivateNoiseError) as exc:
            why = "refused the request" if isinstance(exc, RequestRefused) else "privacy policy"
            print(f"glasu worker {settings.client}: {why}: {exc}", file=sys.stderr)
            return EXIT_POLICY
        except (ProtocolViolation, PayloadError, ValidationError) as exc:
            # a sum whose body does not fit its slot, an answer that is not the wire model: the
            # service's answers are the only input parsed while the worker runs
            raise CliError(f"the service's answer breaks the protocol: {exc}") from exc
        except ServiceError as exc:
            print(f"glasu worker {settings.client}: {exc.describe()}", file=sys.stderr)
            return EXIT_REFUSED
        except PeersMissing as exc:
            print(f"glasu worker {settings.client}: {exc}", file=sys.stderr)
            return EXIT_PEERS_MISSING
        except ServiceUnavailable as exc:
            print(f"glasu worker {settings.client}: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
        summary = {
            "session_id": settings.session,
            "client": settings.client,
            "device": str(loaded.device),
            "passes": result.passes,
            "finished_reason": result.finished_reason,
            "resumed_from": result.resumed_from,
            "skipped_passes": result.skipped,
            "bytes_up": service.traffic.up,
            "bytes_down": service.traffic.down,
            "history": result.history,
        }
    if writer is not None and result.finished_reason == "finished":
        path = writer.finish()
        print(
            f"glasu worker {settings.client}: {writer.rows} predictions in {path}",
            file=sys.stderr,
        )
    if result.model_path is not None:
        summary["model"] = str(result.model_path)
        print(
            f"glasu worker {settings.client}: model kept in {result.model_path} "
            f"(glasu model show {result.model_path})",
            file=sys.stderr,
        )
    if settings.result:
        settings.result.parent.mkdir(parents=True, exist_ok=True)
        settings.result.write_text(json.dumps(summary, indent=2))
    if result.skipped:
        print(
            f"glasu worker {settings.client}: {len(result.skipped)} passes went on without this "
            f"worker (stragglers 'continue'): {result.skipped}",
            file=sys.stderr,
        )
    if result.finished_reason != "finished":
        print(
            f"glasu worker {settings.client}: session ended: {result.finished_reason}",
            file=sys.stderr,
        )
    return 0


def settings_line(
    client: int, options: LocalModelOptions, session: dict[str, Any], *, given: frozenset[str]
) -> str:
    """The backbone this worker runs and the settings the session's recipe chose for the
    workers (``worker_defaults``), each with whose choice it is: this worker's own (given), the
    session's, or the default."""

    def whose(name: str, session_sets: bool) -> str:
        if name in given:
            return "this worker's own"
        return "the session's" if session_sets else "the default"

    parts = [
        f"backbone {options.backbone} ({whose('backbone', session.get('backbone') is not None)})"
    ]
    defaults = session.get("worker_defaults") or {}
    propagation = {"hops"} if options.backbone in PRECOMPUTED_BACKBONES else set()
    for name in sorted(propagation | set(defaults)):
        flag = "--" + name.replace("_", "-")
        parts.append(f"{flag} {getattr(options, name)} ({whose(name, name in defaults)})")
    return f"glasu worker {client}: " + ", ".join(parts)


def evaluation_line(client: int, round_index: int, outcome: PassOutcome) -> str:
    """One evaluation pass for people: this client's scores and, in a private session, those of
    its party-alone reference (as `glasu train` reports them). A passive party of a label
    holder's session (GLASU B.2) has no metric."""
    head = f"client {client} round {round_index}:"
    if outcome.val_accuracy is None and outcome.test_accuracy is None:
        return f"{head} evaluated (no labels here: the label holder's metrics are its own)"
    line = (
        f"{head} loss {outcome.loss:.4f} val {_score(outcome.val_accuracy)} "
        f"test {_score(outcome.test_accuracy)}"
    )
    if outcome.reference_test_accuracy is not None:
        line += f" (party alone: test {outcome.reference_test_accuracy:.4f})"
    return line


def _score(accuracy: float | None) -> str:
    return "n/a" if accuracy is None else f"{accuracy:.4f}"
