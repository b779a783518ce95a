"""One organisation's worker: the GLASU client of models/federated.py, driven over HTTP."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clients.checkpoint import (
    CheckpointError,
    CheckpointStore,
    DigestingCodec,
    Fingerprint,
    WorkerProgress,
)
from clients.model_keeping import ledger_spent, reported_val_accuracy
from clients.owner_ledger import OwnerLedger
from clients.policy import PrivacyPolicy, ReleaseGate, admit_session, session_about
from clients.transport import PeersMissing, ServiceClient, ServiceError
from models.artefact import ModelError, SavedModel
from models.backbone import ModelConfig
from models.client_config import ClientConfig
from models.federated import GlasuClient
from models.keeper import ModelKeeper
from models.outcome import PassOutcome
from models.partition import ClientPartition, check_labels, without_labels
from models.private import make_client
from models.report import recent_training_loss
from secure.aggregation import EmbeddingCodec
from secure.protocol import EmbeddingRequest, NodesRequest, ProtocolViolation
from secure.release_noise import ReleaseKeyedNoise

log = logging.getLogger(__name__)


PRIVATE_DEFAULT_HIDDEN = 128
REJOIN_POLL_SECONDS = 0.25


@dataclass(frozen=True)
class LocalModelOptions:
    """What each organisation chooses for its own part of the model. Only the widths at the
    aggregation layers (the session's) must agree across clients."""

    backbone: str = "gcnii"
    hidden: int | None = None  # default: the aggregation width (plain GLASU) or 128 (private)
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 5e-4
    eval_fanout: int = 10
    seed: int | None = None  # initialisation and dropout; default: the session's seed
    noise_seed: int | None = None  # reproducible DP noise (experiments only)
    cache_rounds: int = 1  # W of the CELU-VFL workset (models/workset.py)
    instance_weighting: bool = False
    weight_threshold: float = 0.5


@dataclass
class WorkerResult:
    passes: int = 0
    finished_reason: str = "finished"
    training_bytes: int = 0  # node sets, shares and sums of training passes, both directions
    history: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)  # the pass of each resume (checkpoint)
    skipped: list[int] = field(default_factory=list)  # passes that went on without this client
    model_path: Path | None = None  # where the kept model went (training with model_out)


@dataclass(frozen=True)
class ResumedPass:
    """The pass a resumed worker recomputes first, and the plaintext digests of the shares it
    had journaled for that pass before it stopped (``{layer: sha256}``)."""

    pass_index: int
    shares: Mapping[str, str]


class SessionMismatch(ValueError):
    """This worker's data or settings cannot take part in the session: found when it joins,
    before it sends anything."""


def client_config_from_session(
    session_config: dict[str, Any], options: LocalModelOptions
) -> ClientConfig:
    privacy = session_config.get("privacy")
    widths = {a["width"] for a in session_config["agg_layers"]}
    if privacy is not None:
        hidden = options.hidden or PRIVATE_DEFAULT_HIDDEN
    elif len(widths) != 1:
        raise SessionMismatch(
            f"this worker needs one width at every aggregation layer, got {widths}"
        )
    else:
        hidden = widths.pop()
        if options.hidden not in (None, hidden):
            raise SessionMismatch(
                f"--hidden {options.hidden} differs from the session's aggregation width {hidden}"
            )
    model = ModelConfig(
        backbone=options.backbone,  # type: ignore[arg-type]
        layers=session_config["layers"],
        hidden=hidden,
        dropout=options.dropout,
        # the private arrangement's release is the session's only aggregation layer
        receiver_width=session_config["agg_layers"][0]["width"] if privacy else 0,
    )
    return ClientConfig(
        model=model,
        agg_layers=tuple(a["layer"] for a in session_config["agg_layers"]),
        stale=session_config["stale"],
        cache_rounds=options.cache_rounds,
        instance_weighting=options.instance_weighting,
        weight_threshold=options.weight_threshold,
        fanout=session_config["fanout"],
        eval_fanout=options.eval_fanout,
        occurrence_cap=privacy["occurrence_cap"] if privacy else None,
        count_aware=session_config.get("nodes") == "union",
        label_holder=session_config.get("label_holder"),
        lr=options.lr,
        weight_decay=options.weight_decay,
        seed=session_config["seed"] if options.seed is None else options.seed,
    )


def session_partition(partition: ClientPartition, config: dict[str, Any]) -> ClientPartition:
    """The partition as the session uses it: a passive party of a label holder's session keeps
    no label and no split (GLASU B.2); every other client needs its labels."""
    if partition.held is not None and config.get("nodes") != "union":
        raise SessionMismatch(
            f"this party lacks {int((~partition.held).sum())} of the {partition.num_nodes} "
            "aligned nodes (an alignment over the union), but the session averages over the "
            "intersection: create the session from the alignment (nodes 'union')"
        )
    holder = config.get("label_holder")
    if holder is not None and holder != partition.client:
        return without_labels(partition)
    remedy = (
        "otherwise the operator names the one party with labels when creating the session "
        "(glasu session create --label-holder M; docs/data.md)"
        if holder is None
        else f"the session names this party (client {holder}) the label holder "
        "(--label-holder): give it its labels (glasu prepare --labels) or name another holder"
    )
    try:
        check_labels(partition, where="this worker's data", remedy=remedy)
    except ValueError as exc:
        raise SessionMismatch(str(exc)) from None
    return partition


def run_worker(
    service: ServiceClient,
    partition: ClientPartition,
    *,
    options: LocalModelOptions,
    codec: EmbeddingCodec,
    policy: PrivacyPolicy,
    ledger: OwnerLedger | None,
    device: torch.device | str = "cpu",
    on_pass: Callable[[dict[str, Any], PassOutcome], None] | None = None,
    checkpoints: CheckpointStore | None = None,
    on_resume: Callable[[int, Path], None] | None = None,
    model: SavedModel | None = None,
    model_out: Path | None = None,
    alignment_digest: str | None = None,
) -> WorkerResult:
    """Follow the session's passes until it says "done". Before anything is sent, the session
    must satisfy this organisation's privacy ``policy`` (:class:`PolicyRefusal` otherwise); with
    DP on, every release is written to ``ledger`` before it leaves (:class:`BudgetSpent` when the
    next one would exceed the policy).

    With ``checkpoints``, the worker saves its state after every completed pass (and once
    before the first) and, if a checkpoint of this session is there, resumes from it: it
    recomputes the pass it was in, bit for bit, and rejoins the service there
    (clients/checkpoint.py; :class:`CheckpointError` for a checkpoint it cannot use).

    A training session with ``model_out`` keeps the best evaluation round's model there
    (clients/model_keeper.py); a scoring session needs the party's trained ``model``
    (:class:`models.artefact.ModelError` when it does not fit the session or the data)."""
    session = service.session()
    if session.get("session_id") != service.session_id:
        # the owner's ledger is keyed by the id it configured: a service that answers for
        # another session could otherwise pass one session's releases off as another's
        raise ProtocolViolation(
            f"the service answered for session {session.get('session_id')!r}, not for the "
            f"configured session {service.session_id!r}"
        )
    config = session["config"]
    if partition.client != service.client_index:
        raise SessionMismatch(
            f"the partition is client {partition.client}'s, but this worker is "
            f"client {service.client_index}"
        )
    if partition.clients != config["clients"] or partition.num_nodes != config["num_nodes"]:
        raise SessionMismatch(
            f"the partition (M={partition.clients}, {partition.num_nodes} nodes) does not match "
            f"the session (M={config['clients']}, {config['num_nodes']} nodes)"
        )
    if codec.encoding != config["encoding"]:
        raise SessionMismatch(
            f"the session expects {config['encoding']} shares, this worker's codec "
            f"makes {codec.encoding}: give the secret context (or --no-he) to match"
        )
    partition = session_partition(partition, config)
    scoring = config.get("kind") == "scoring"
    if scoring:
        if model is None:
            raise ModelError("a scoring session needs this party's trained model (--model DIR)")
        check_model_fits(model, config, partition)
    privacy = admit_session(
        policy,
        session,
        session_id=service.session_id,
        encrypted=codec.encoding == "ckks",
        ledger=ledger,
    )
    gate = None
    noise = None
    if privacy is not None:
        if ledger is None:
            raise ValueError("a private session needs the worker's local privacy ledger")
        gate = ReleaseGate(policy, privacy, ledger, service.session_id, scoring=scoring)
        ledger.note_session(service.session_id, session_about(session, privacy))
        if options.noise_seed is None:
            scope = f"{service.session_id}/client{service.client_index}"
            noise = ReleaseKeyedNoise(ledger.noise_secret(), scope=scope)
    if model is not None:
        options = options_of_model(model, options)
    client_config = client_config_from_session(config, options)
    if model is not None:
        client_config = dataclasses.replace(
            client_config, num_classes=model.manifest["model"]["num_classes"]
        )
    client = make_client(
        partition,
        client_config,
        codec=codec if checkpoints is None else DigestingCodec(codec),
        device=device,
        privacy=privacy,
        seed=config["seed"],
        noise_seed=options.noise_seed,
        noise=noise,
    )
    if model is not None:
        client.network.load_state_dict(model.weights)
    keeper = None
    if model_out is not None and not scoring:
        keeper = ModelKeeper(client, private=privacy is not None)
    progress = WorkerProgress()
    resume: ResumedPass | None = None
    fingerprint: Fingerprint | None = None
    if checkpoints is not None:
        fingerprint = Fingerprint.of(
            session=session,
            client=service.client_index,
            options=options,
            encoding=codec.encoding,
            partition=partition,
        )
        if checkpoints.exists():
            progress = checkpoints.load(client, fingerprint).progress
            progress.next_pass = rejoin_pass(session, progress.next_pass, checkpoints.path)
            progress.resumed_from.append(progress.next_pass)
            journal = checkpoints.uploads()
            shares = journal["shares"] if journal.get("pass") == progress.next_pass else {}
            resume = ResumedPass(pass_index=progress.next_pass, shares=shares)
            service.traffic.up, service.traffic.down = progress.bytes_up, progress.bytes_down
            log.info("client %d resumed from pass %d", service.client_index, progress.next_pass)
            if on_resume:
                on_resume(progress.next_pass, checkpoints.path)
        else:
            progress.next_pass = rejoin_pass(session, 0, None)
            checkpoints.save(client, progress, fingerprint)
    else:
        progress.next_pass = rejoin_pass(session, 0, None)
    pass_index = progress.next_pass
    skipped: list[int] = []
    while True:
        info = service.pass_info(pass_index)
        if info["kind"] == "done":
            result = WorkerResult(finished_reason=info.get("reason", "finished"))
            break
        exchanged_before = service.traffic.up + service.traffic.down
        try:
            outcome = drive_pass(
                client, service, info, gate=gate, checkpoints=checkpoints, resume=resume
            )
        except ServiceError as exc:
            if not went_on_without(exc, config):
                raise
            rejoin = next_pass_after(service, pass_index)
            log.warning(
                "pass %d went on without client %d (%s); it rejoins at pass %d",
                pass_index,
                service.client_index,
                exc.slug,
                rejoin,
            )
            skipped.extend(range(pass_index, rejoin))
            pass_index = rejoin
            resume = None
            if checkpoints is not None:
                assert fingerprint is not None
                progress.next_pass = pass_index
                checkpoints.save(client, progress, fingerprint)
            continue
        if outcome.kind == "train":
            progress.training_bytes += service.traffic.up + service.traffic.down - exchanged_before
        if privacy is None and client.holds_labels:
            # Under DP a loss or an accuracy computed on clean features would be a release the
            # ledger does not count: the worker keeps them to itself (result file, stdout). A
            # passive party (GLASU B.2) has no metric at all.
            service.report_metrics(
                pass_index,
                {
                    "loss": outcome.loss,
                    "val_accuracy": outcome.val_accuracy,
                    "test_accuracy": outcome.test_accuracy,
                },
            )
        if outcome.kind == "train":
            progress.training_losses.append(outcome.loss)
        else:
            progress.history.append(
                {
                    "pass": pass_index,
                    "round": info["round"],
                    "loss": recent_training_loss(progress.training_losses),
                    "val_accuracy": outcome.val_accuracy,
                    "test_accuracy": outcome.test_accuracy,
                    # the party-alone reference (private runs): stays in this local file
                    "reference_val_accuracy": outcome.reference_val_accuracy,
                    "reference_test_accuracy": outcome.reference_test_accuracy,
                    "test_metrics": outcome.test_metrics,
                    "reference_test_metrics": outcome.reference_test_metrics,
                    "bytes_up": service.traffic.up,
                    "bytes_down": service.traffic.down,
                    "training_bytes": progress.training_bytes,
                }
            )
        if keeper is not None:
            keeper.observe(info, outcome)
        if on_pass:
            on_pass(info, outcome)
        progress.passes += 1
        pass_index += 1
        resume = None
        if checkpoints is not None:
            assert fingerprint is not None
            progress.next_pass = pass_index
            progress.bytes_up, progress.bytes_down = service.traffic.up, service.traffic.down
            checkpoints.save(client, progress, fingerprint)
    if keeper is not None and result.finished_reason == "finished":
        assert model_out is not None
        holders = config["clients"] if config.get("label_holder") is None else 1
        kept, chosen_by = keeper.choose(
            lambda: reported_val_accuracy(service, set(keeper.snapshots), holders=holders)
        )
        result.model_path = keeper.save(
            model_out,
            kept=kept,
            chosen_by=chosen_by,
            session_config=config,
            session_id=service.session_id,
            alignment_digest=alignment_digest,
            privacy=privacy,
            spent=ledger_spent(privacy, policy, ledger, service.session_id),
        )
    if gate is not None:
        note_accuracy(gate.ledger, service.session_id, progress.history)
    result.passes = progress.passes
    result.training_bytes = progress.training_bytes
    result.history = progress.history
    result.resumed_from = progress.resumed_from
    result.skipped = skipped
    return result


def options_of_model(model: SavedModel, options: LocalModelOptions) -> LocalModelOptions:
    """The local settings that rebuild ``model``'s network (whatever the worker's flags say)."""
    saved = model.manifest["model"]
    return dataclasses.replace(
        options,
        backbone=saved["backbone"],
        hidden=saved["hidden"],
        dropout=saved["dropout"],
        eval_fanout=saved["eval_fanout"],
        seed=saved["seed"],
    )


def check_model_fits(
    model: SavedModel, config: Mapping[str, Any], partition: ClientPartition
) -> None:
    """A scoring session scores with the model it names, built as it was trained, on data of
    the model's feature schema: :class:`ModelError` naming what differs."""
    saved = model.manifest["model"]
    if config.get("model_session") not in (None, model.manifest["session_id"]):
        raise ModelError(
            f"the scoring session uses the models of session {config['model_session']}, but "
            f"{model.path} was trained in session {model.manifest['session_id']}"
        )
    expected = {
        "layers": config["layers"],
        "agg_layers": [a["layer"] for a in config["agg_layers"]],
        "widths": [a["width"] for a in config["agg_layers"]],
        "session_seed": config["seed"],
    }
    for name, value in expected.items():
        if saved.get(name) != value:
            raise ModelError(
                f"the scoring session has {name} {value}, the model {model.path} was trained "
                f"with {saved.get(name)}: create the scoring session from the model's manifest"
            )
    release = model.manifest.get("release")
    privacy = config.get("privacy")
    if (release is None) != (privacy is None):
        raise ModelError(
            f"the model {model.path} was trained "
            + ("without" if release is None else "with")
            + " differential privacy and the scoring session is "
            + ("private" if privacy else "not")
            + ": score with the privacy the model was trained with"
        )
    if release is not None and any(
        privacy.get(name) != release[name] for name in ("noise_multiplier", "clip")
    ):
        raise ModelError(
            f"the scoring session's noise (z {privacy.get('noise_multiplier')}, clip "
            f"{privacy.get('clip')}) differs from the training's (z {release['noise_multiplier']},"
            f" clip {release['clip']}): the model reads the others' release at that noise level"
        )
    if model.manifest["party"]["index"] != partition.client:
        raise ModelError(
            f"{model.path} is party {model.manifest['party']['index']}'s model, this worker is "
            f"client {partition.client}"
        )
    if partition.feature_names is not None:
        model.check_features(partition.feature_names)
    elif int(partition.features.shape[1]) != saved["in_features"]:
        raise ModelError(
            f"the data has {int(partition.features.shape[1])} feature columns, the model "
            f"{model.path} {saved['in_features']}"
        )


def went_on_without(exc: ServiceError, config: Mapping[str, Any]) -> bool:
    """Whether the service refused a pass because it went on without this client (stragglers
    "continue"): it was excluded, or the session has passed it by."""
    if config.get("stragglers") != "continue" or exc.status != 409:
        return False
    return exc.slug in ("excluded", "wrong-pass")


def next_pass_after(service: ServiceClient, pass_index: int) -> int:
    """The pass to go on with after ``pass_index`` went on without this client: ask the
    service to wait for it again (from the current pass or the next) and wait for that pass."""
    back_at = service.rejoin()
    deadline = time.monotonic() + service.peer_wait_seconds
    while True:
        session = service.session()
        current = session["current_pass"]
        if current >= back_at or session["state"] != "running":
            return max(current, pass_index + 1)
        if time.monotonic() >= deadline:
            raise PeersMissing(
                f"pass {pass_index} went on without this client and the session did not reach "
                f"pass {back_at} within {service.peer_wait_seconds:.0f} s"
            )
        time.sleep(REJOIN_POLL_SECONDS)


def rejoin_pass(session: Mapping[str, Any], next_pass: int, checkpoint: Path | None) -> int:
    """The pass a worker at ``next_pass`` joins at: ``next_pass``, if the service is at that
    pass or at the next one (its share of ``next_pass`` may have completed the pass before it
    stopped); under stragglers "continue" also the service's current pass, however far on."""
    current = session.get("current_pass")
    if not isinstance(current, int) or next_pass <= current <= next_pass + 1:
        return next_pass
    if current > next_pass and session["config"].get("stragglers") == "continue":
        return current
    if checkpoint is None:
        raise CheckpointError(
            f"session {session.get('session_id')} is at pass {current} and this worker has no "
            "checkpoint of it, so it cannot rejoin: restart it with the --checkpoint folder of "
            "its first run (and without --no-checkpoint)"
        )
    if current < next_pass:
        raise CheckpointError(
            f"the checkpoint {checkpoint} is at pass {next_pass} but session "
            f"{session.get('session_id')} is at pass {current}: the service lost passes (a "
            "restored database?); a worker cannot go back, start a new session"
        )
    raise CheckpointError(
        f"the checkpoint {checkpoint} is at pass {next_pass} but session "
        f"{session.get('session_id')} is at pass {current}: the service cannot have gone on "
        "without this client, so the checkpoint is older than this worker's last uploads "
        "(restored from a backup?)"
    )


def note_accuracy(ledger: OwnerLedger, session_id: str, history: list[dict[str, Any]]) -> None:
    """The last evaluation's test accuracy and the party-alone reference, for the owner's
    report (``glasu report``); nothing when no evaluation measured them."""
    measured = [h for h in history if h.get("test_accuracy") is not None]
    if measured:
        last = measured[-1]
        ledger.note_accuracy(
            session_id,
            test_accuracy=last["test_accuracy"],
            reference_test_accuracy=last.get("reference_test_accuracy"),
        )


def admit_release(
    gate: ReleaseGate, pass_index: int, request: EmbeddingRequest, *, pass_kind: str | None = None
) -> None:
    """Every share of a private session is a release: it passes the owner's gate before it
    leaves (:class:`BudgetSpent` if it would go past the policy)."""
    if request.release is None:
        raise RuntimeError("a share of a private session without the digest of its release")
    if not gate.admit(
        pass_index, layer=request.layer, release=request.release, pass_kind=pass_kind
    ):
        log.info(
            "pass %d, layer %d: the same release as before (the same inputs, hence the same "
            "noise): not counted twice",
            pass_index,
            request.layer,
        )


def drive_pass(
    client: GlasuClient,
    service: ServiceClient,
    info: dict[str, Any],
    *,
    gate: ReleaseGate | None = None,
    checkpoints: CheckpointStore | None = None,
    resume: ResumedPass | None = None,
) -> PassOutcome:
    """Answer the client's requests of one pass with calls to the service; with ``gate`` (a
    private session), every share passes it first."""
    pass_index = info["pass"]
    steps = client.run_pass(
        pass_index=pass_index,
        kind=info["kind"],
        output_nodes=np.asarray(info["output_nodes"], dtype=np.int64),
    )
    answer: Any = None
    while True:
        try:
            request = steps.send(answer) if answer is not None else next(steps)
        except StopIteration as finished:
            return finished.value
        if isinstance(request, NodesRequest):
            answer = service.exchange_nodes(pass_index, request.layer, request.nodes)
        elif isinstance(request, EmbeddingRequest):
            if gate is not None:
                admit_release(gate, pass_index, request, pass_kind=info["kind"])
            if checkpoints is None:
                answer = service.exchange_embedding(
                    pass_index,
                    request.layer,
                    request.payload,
                    rows=request.rows,
                    cols=request.cols,
                    encoding=client.codec.encoding,
                )
            else:
                answer = exchange_share(client, service, pass_index, request, checkpoints, resume)
        else:
            raise TypeError(f"unexpected request {request!r}")


def exchange_share(
    client: GlasuClient,
    service: ServiceClient,
    pass_index: int,
    request: EmbeddingRequest,
    checkpoints: CheckpointStore,
    resume: ResumedPass | None,
) -> Any:
    """Upload a share (its plaintext digest journaled first) and fetch the sum. In the pass a
    resumed worker recomputes, a slot that already holds this worker's share from before the
    crash (409 ``conflict``: CKKS encrypts the same plaintext to other bytes) is taken over when
    the recomputed plaintext is the journaled one: the sum then holds exactly this share, and
    Extract(sum, share) is what the uninterrupted run computed."""
    digest = getattr(client.codec, "last_digest", None)
    if digest is not None:
        checkpoints.record_upload(pass_index, request.layer, digest)
        client.codec.last_digest = None  # type: ignore[attr-defined]  # this payload's, once
    try:
        service.put_embedding(
            pass_index,
            request.layer,
            request.payload,
            rows=request.rows,
            cols=request.cols,
            encoding=client.codec.encoding,
        )
    except ServiceError as exc:
        if exc.status != 409 or exc.slug != "conflict" or resume is None:
            raise
        if resume.pass_index != pass_index:
            raise
        before = resume.shares.get(str(request.layer))
        if before is None or before != digest:
            raise CheckpointError(
                f"pass {pass_index}, layer {request.layer}: the service holds a share this "
                "worker uploaded before it stopped, and the share it recomputed from its "
                "checkpoint "
                + ("is not in its upload journal" if before is None else "differs from it")
                + " (another --threads or device, or a damaged journal?): the pass cannot be "
                "completed correctly"
            ) from exc
        log.info(
            "pass %d, layer %d: the service holds this worker's share from before the restart "
            "(the same plaintext); taking its sum",
            pass_index,
            request.layer,
        )
    return service.fetch_aggregate(pass_index, request.layer)
