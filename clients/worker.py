"""One organisation's worker: the GLASU client of models/federated.py, driven over HTTP.

:class:`WorkerRun` joins a session (``clients/session_fit.py`` checks that this worker fits it),
resumes from a checkpoint when there is one, runs the passes (``clients/pass_driver.py``) and
skips those that went on without it (stragglers "continue")."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clients.checkpoint import CheckpointStore, Fingerprint, WorkerProgress
from clients.join import admit_prediction_sharing, disclosure_counter, join, refusal_reported
from clients.model_keeping import ledger_spent, reported_val_accuracy
from clients.owner_ledger import OwnerLedger
from clients.pass_driver import PassDriver, ResumedPass
from clients.policy import (
    PrivacyPolicy,
    ReleaseGate,
    admit_session,
    admit_session_id,
    session_about,
)
from clients.predictions import IdsByNode
from clients.rejoin import next_pass_after, rejoin_pass, stated_pass_info
from clients.request_signing import RequestCheck
from clients.service_http import ServiceError
from clients.session_client import SessionClient
from clients.session_fit import (
    LocalModelOptions,
    check_answer_reaches,
    client_config_from_session,
    fit_to_session,
    options_for_session,
    options_of_model,
)
from clients.sign_scoring import KeptSignScorer, check_scoring_session, note_scoring
from clients.sign_session import SignWorker, check_release_session
from models.artefact import SavedModel, is_private_sign
from models.client_config import ClientConfig
from models.data.partition import ClientPartition
from models.federated import GlasuClient
from models.keeper import ModelKeeper
from models.outcome import PassOutcome
from models.private import make_client
from models.release import DpRelease
from models.run_summary import recent_training_loss
from secure.aggregation import EmbeddingCodec
from secure.protocol import ProtocolViolation
from secure.release_noise import ReleaseKeyedNoise, ReleaseMechanism, release_keyed_noise
from secure.wire.passes import PassInfo

log = logging.getLogger(__name__)


@dataclass
class WorkerResult:
    passes: int = 0
    finished_reason: str = "finished"
    training_bytes: int = 0  # node sets, shares and sums of training passes, both directions
    history: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)  # the pass of each resume (checkpoint)
    skipped: list[int] = field(default_factory=list)  # passes that went on without this client
    model_path: Path | None = None  # where the kept model went (training with model_out)


class WorkerRun:
    """A worker joining its session: :meth:`run` follows the session's passes until it says
    "done". Before anything is sent (here, when it is built), the session must fit this worker
    (``clients/session_fit.py``) and satisfy this organisation's privacy ``policy``
    (:class:`PolicyRefusal` otherwise); with DP on, every release is written to ``ledger`` before
    it leaves (:class:`BudgetSpent` when the next one would exceed the policy).

    With ``checkpoints``, the worker saves its state after every completed pass (and once
    before the first) and, if a checkpoint of this session is there, resumes from it: it
    recomputes the pass it was in, bit for bit, and rejoins the service there
    (clients/checkpoint.py; :class:`CheckpointError` for a checkpoint it cannot use).

    A training session with ``model_out`` keeps the best evaluation round's model there
    (clients/model_keeping.py); a scoring session needs the party's trained ``model``
    (:class:`models.artefact.ModelError` when it does not fit the session or the data).

    A request session of an online session is checked first by ``request_check`` (signed by
    the answering party, over the signed nodes, never replayed: clients/request_signing.py).

    In a session with ``ready_gate`` a refusal here is told to the service, which closes the
    session, and :meth:`run` first says the worker is ready and waits until every worker did
    (clients/join.py), so that nothing is released into a session another worker refused.

    :meth:`run` is the join, :meth:`resume` (from the checkpoint, or at the start), :meth:`loop`
    over the passes (with :meth:`skip` past those that went on without it), :meth:`keep_model`."""

    def __init__(
        self,
        service: SessionClient,
        partition: ClientPartition,
        *,
        options: LocalModelOptions,
        codec: EmbeddingCodec,
        policy: PrivacyPolicy,
        ledger: OwnerLedger | None,
        device: torch.device | str = "cpu",
        on_pass: Callable[[PassInfo, PassOutcome], None] | None = None,
        checkpoints: CheckpointStore | None = None,
        on_resume: Callable[[int, Path], None] | None = None,
        model: SavedModel | None = None,
        model_out: Path | None = None,
        alignment_digest: str | None = None,
        given_options: frozenset[str] = frozenset(),
        writes_predictions: bool = False,
        request_check: RequestCheck | None = None,
        ids_of_node: IdsByNode | None = None,
    ) -> None:
        self.service = service
        self.on_pass = on_pass
        self.on_resume = on_resume
        self.alignment_digest = alignment_digest
        self.policy = policy
        self.ledger = ledger
        self.checkpoints = checkpoints
        self.model_out = model_out
        self.ids_of_node = ids_of_node
        self.status = service.session()
        if self.status.session_id != service.session_id:
            # the owner's ledger is keyed by the id it configured: a service that answers for
            # another session could otherwise pass one session's releases off as another's
            raise ProtocolViolation(
                f"the service answered for session {self.status.session_id!r}, not for the "
                f"configured session {service.session_id!r}"
            )
        # the session as the service sent it, for what hashes or keeps it (the checkpoint's
        # fingerprint, the model's manifest) and the owner's policy
        self.session_json = self.status.model_dump(mode="json", by_alias=True)
        self.config = self.status.config
        self.request_check = request_check
        with refusal_reported(service, self.config):
            if request_check is not None:  # a request of an online session: signed, new
                if ledger is None:
                    raise ValueError("a request of an online session needs the owner's ledger")
                request_check.admit(self.status, lambda: service.pass_info(0), ledger)
            self.partition = fit_to_session(
                partition, self.config, client=service.client_index, codec=codec, model=model
            )
            self.scoring = self.config.kind == "scoring"
            admit_prediction_sharing(policy, self.config, client=service.client_index)
            self.count_disclosure = disclosure_counter(
                ledger, self.config, client=service.client_index, session_id=service.session_id
            )
            if writes_predictions:
                check_answer_reaches(self.config, client=service.client_index)
            # a scoring of a kept private sign model releases nothing: the worker knows it from
            # its own model (``fit_to_session`` checked that the session says so too)
            kept_release = self.scoring and model is not None and is_private_sign(model.manifest)
            self.privacy = admit_session(
                policy,
                self.session_json,
                session_id=service.session_id,
                encrypted=codec.encoding != "float32",
                ledger=ledger,
                post_processing=kept_release,
            )
            # the backbone the session's settings were chosen for, and the session's defaults for
            # the options this worker's owner did not give (``given_options``)
            options = options_for_session(self.session_json["config"], options, given=given_options)
            noise = self._noise(options)
            if model is not None:
                options = options_of_model(model, options)
            self.options = options
            client_config = client_config_from_session(self.session_json["config"], options)
            self.sign: SignWorker | KeptSignScorer | None = None
            if self.config.kind == "release":
                self._join_release(client_config, codec, noise, device=device)
                self.resumed, self.skipped = None, []
                return
            if kept_release:
                assert model is not None
                self._join_kept_scoring(client_config, codec, model, device=device)
                self.resumed, self.skipped = None, []
                return
            if model is not None:
                client_config = dataclasses.replace(
                    client_config, num_classes=model.manifest["model"]["num_classes"]
                )
            self.client: GlasuClient = make_client(
                self.partition,
                client_config,
                codec=codec,
                device=device,
                privacy=self.privacy,
                seed=self.config.seed,
                noise_seed=options.noise_seed,
                noise=noise,
            )
            if model is not None:
                self.client.network.load_state_dict(model.weights)
            self.gate = self._gate()
            self.keeper = (
                ModelKeeper(self.client, private=self.privacy is not None)
                if model_out is not None and not self.scoring
                else None
            )
            self.fingerprint = (
                None
                if checkpoints is None
                else Fingerprint.of(
                    session=self.session_json,
                    client=service.client_index,
                    options=options,
                    encoding=codec.encoding,
                    partition=self.partition,
                )
            )
        self.resumed: ResumedPass | None = None
        self.skipped: list[int] = []

    def _noise(self, options: LocalModelOptions) -> ReleaseKeyedNoise | None:
        """A private session's release-keyed noise, unless the noise is seeded for an
        experiment."""
        if self.privacy is None:
            return None
        if self.ledger is None:
            raise ValueError("a private session needs the worker's local privacy ledger")
        if options.noise_seed is not None:
            return None
        scope = f"{self.service.session_id}/client{self.service.client_index}"
        return release_keyed_noise(
            self.ledger.noise_secret(), scope=scope, split_noise=self.privacy.split_noise
        )

    def _join_release(
        self,
        client_config: ClientConfig,
        codec: EmbeddingCodec,
        noise: ReleaseKeyedNoise | None,
        *,
        device: torch.device | str,
    ) -> None:
        """A release session (clients/sign_session.py): one release at most, checked against
        the plan before anything leaves; no checkpoint (a restart after the release joins a new
        session: the ledger refuses the same id again); with ``model_out`` its model is kept
        (its head's best round, its noisy release)."""
        privacy = check_release_session(self.session_json, self.privacy)
        self.sign = SignWorker(
            self.partition, client_config, self.config, privacy, codec,
            noise=noise, noise_seed=self.options.noise_seed, device=device,
            keeps_model=self.model_out is not None,
        )  # fmt: skip
        self.checkpoints = self.keeper = self.fingerprint = None
        self.gate = self._gate(self.sign.mechanism)

    def _join_kept_scoring(
        self,
        client_config: ClientConfig,
        codec: EmbeddingCodec,
        model: SavedModel,
        *,
        device: torch.device | str,
    ) -> None:
        """A scoring session of a kept private sign model (clients/sign_scoring.py): one pass,
        post-processing of the kept release; no gate (nothing it sends is a release), the
        session in the owner's ledger with no release. Its kept block is computed once per
        loaded partition and ids (an online worker's requests share it), and a request's pass
        is checked against the signed request."""
        check_scoring_session(self.config, model, passes_total=self.status.passes_total)
        classes = model.manifest["model"]["num_classes"]
        check = self.request_check
        self.sign = KeptSignScorer(
            self.partition, dataclasses.replace(client_config, num_classes=classes),
            self.config, model, codec,
            own_ids=self._own_ids(), device=device,
            check_pass=None if check is None else functools.partial(check.check_pass, self.status),
            keys=("nodes",) if self.ids_of_node is None else ("ids", id(self.ids_of_node)),
        )  # fmt: skip
        self.checkpoints = self.keeper = self.fingerprint = self.gate = None
        note_scoring(self.ledger, self.service.session_id, model, self.config)

    def _own_ids(self) -> np.ndarray:
        """Each aligned node's key in a kept release: the party's own id (None where it lacks
        the node), or its index where this worker has no ids of its own."""
        nodes = np.arange(self.partition.num_nodes, dtype=np.int64)
        if self.ids_of_node is None:
            return nodes.astype(object)
        return self.ids_of_node[nodes]

    def run_release(self, sign: SignWorker | KeptSignScorer) -> WorkerResult:
        """The session's one pass (a scoring that shares its answer: each part counted in the
        answering party's ledger before it leaves), then (a release session) its rounds trained
        here (no more passes)."""
        progress = WorkerProgress(passes=1)
        masked = self.config.secure_aggregation == "masks"
        driver = PassDriver(self.service, gate=self.gate, on_disclosure=self.count_disclosure)
        for info, outcome in sign.session_passes(self.service, driver, masked):
            self._record(progress, info, outcome)
            # a partner that receives the scoring's shared answer writes it too
            if self.on_pass and (sign.receives or outcome.answer is not None):
                self.on_pass(info, outcome)
        return WorkerResult(
            passes=1, finished_reason=sign.finished or "finished", history=progress.history
        )

    def _gate(self, mechanism: ReleaseMechanism | None = None) -> ReleaseGate | None:
        """A private session's release gate (the owner's ledger), once the session id passed
        the owner's rule (``clients.policy.admit_session_id``: :class:`PolicyRefusal` for an id
        that released this data before, unless resumed from this worker's checkpoint, or with
        another mechanism); the ledger then keeps the session and its mechanism."""
        if self.privacy is None:
            return None
        assert self.ledger is not None
        if mechanism is None:
            release = self.client.joint.release
            assert isinstance(release, DpRelease)
            mechanism = release.settings.mechanism
        session_id = self.service.session_id
        checkpoints = self.checkpoints
        admit_session_id(
            self.ledger,
            session_id=session_id,
            mechanism=mechanism,
            checkpoint=checkpoints.path if checkpoints and checkpoints.exists() else None,
        )
        self.ledger.note_session(
            session_id,
            session_about(self.session_json, self.privacy),
            mechanism=mechanism.canonical(),
        )
        return ReleaseGate(
            self.policy, self.privacy, self.ledger, session_id, mechanism, scoring=self.scoring,
            one_release=self.config.kind == "release",
        )  # fmt: skip

    def run(self) -> WorkerResult:
        join(self.service, self.config)
        result = self.run_release(self.sign) if self.sign is not None else self.loop(self.resume())
        if result.finished_reason == "finished":
            result.model_path = self.keep_model()
        if self.gate is not None:
            note_accuracy(self.gate.ledger, self.service.session_id, result.history)
        return result

    # -- resume, loop, skip -----------------------------------------------------------------------

    def resume(self) -> WorkerProgress:
        """Where this worker starts: its checkpoint's pass (recomputed first), or the start; the
        state is saved once before the first pass."""
        progress = WorkerProgress()
        if self.checkpoints is None or not self.checkpoints.exists():
            progress.next_pass = rejoin_pass(self.status, 0, None)
            self._save(progress)
            return progress
        checkpoints, service = self.checkpoints, self.service
        assert self.fingerprint is not None
        progress = checkpoints.load(self.client, self.fingerprint).progress
        progress.next_pass = rejoin_pass(self.status, progress.next_pass, checkpoints.path)
        progress.resumed_from.append(progress.next_pass)
        journal = checkpoints.uploads()
        shares = journal["shares"] if journal.get("pass") == progress.next_pass else {}
        self.resumed = ResumedPass(pass_index=progress.next_pass, shares=shares)
        service.traffic.up, service.traffic.down = progress.bytes_up, progress.bytes_down
        log.info("client %d resumed from pass %d", service.client_index, progress.next_pass)
        if self.on_resume:
            self.on_resume(progress.next_pass, checkpoints.path)
        return progress

    def loop(self, progress: WorkerProgress) -> WorkerResult:
        """Run the passes from ``progress.next_pass`` until the session says "done"."""
        service = self.service
        masked = self.config.secure_aggregation == "masks"
        while True:
            next_pass = progress.next_pass
            info = stated_pass_info(service, next_pass) if masked else service.pass_info(next_pass)
            if self.request_check is not None:
                self.request_check.check_pass(self.status, info)
            if info.kind == "done":
                break
            if self._masked_without_this_client(info):
                self.skip(progress, "not among the pass's participants")
                continue
            exchanged_before = service.traffic.up + service.traffic.down
            try:
                driver = PassDriver(
                    service, gate=self.gate, checkpoints=self.checkpoints, resume=self.resumed,
                    on_disclosure=self.count_disclosure,
                )  # fmt: skip
                outcome = driver.drive(self.client, info)
            except ServiceError as exc:
                if not self._went_on_without(exc):
                    raise
                self.skip(progress, exc.slug)
                continue
            if outcome.kind == "train":
                exchanged = service.traffic.up + service.traffic.down - exchanged_before
                progress.training_bytes += exchanged
            self._record(progress, info, outcome)
            if self.on_pass:
                self.on_pass(info, outcome)
            progress.passes += 1
            progress.next_pass += 1
            progress.bytes_up, progress.bytes_down = service.traffic.up, service.traffic.down
            self.resumed = None
            self._save(progress)
        return WorkerResult(
            passes=progress.passes,
            finished_reason=info.reason or "finished",
            training_bytes=progress.training_bytes,
            history=progress.history,
            resumed_from=progress.resumed_from,
            skipped=self.skipped,
        )

    def skip(self, progress: WorkerProgress, why: str) -> None:
        """The pass went on without this client: ask the service to wait for it again (from
        the current pass or the next), and go on at the pass it rejoins."""
        pass_index = progress.next_pass
        rejoin = next_pass_after(self.service, pass_index)
        log.warning(
            "pass %d went on without client %d (%s); it rejoins at pass %d",
            pass_index,
            self.service.client_index,
            why,
            rejoin,
        )
        self.skipped.extend(range(pass_index, rejoin))
        progress.next_pass = rejoin
        self.resumed = None
        self._save(progress)

    def keep_model(self) -> Path | None:
        """With ``model_out`` (training): keep the best evaluation round's model there."""
        if isinstance(self.sign, SignWorker) and self.model_out is not None:
            return self.sign.save_model(
                self.model_out,
                own_ids=None if self.ids_of_node is None else self._own_ids(),
                session_id=self.service.session_id,
                session_config=self.session_json["config"],
                alignment_digest=self.alignment_digest,
                spent=ledger_spent(self.privacy, self.policy, self.ledger, self.service.session_id),
            )
        if self.keeper is None:
            return None
        assert self.model_out is not None
        keeper, service, config = self.keeper, self.service, self.config
        holders = config.clients if config.label_holder is None else 1
        kept, chosen_by = keeper.choose(
            lambda: reported_val_accuracy(service, set(keeper.snapshots), holders=holders)
        )
        return keeper.save(
            self.model_out,
            kept=kept,
            chosen_by=chosen_by,
            session_config=self.session_json["config"],
            session_id=service.session_id,
            alignment_digest=self.alignment_digest,
            privacy=self.privacy,
            spent=ledger_spent(self.privacy, self.policy, self.ledger, service.session_id),
        )

    # -- the steps ------------------------------------------------------------------------------

    def _record(self, progress: WorkerProgress, info: PassInfo, outcome: PassOutcome) -> None:
        """Report a pass's metrics to the service (where that is no release) and keep them."""
        service = self.service
        if self.privacy is None and self.client.holds_labels:
            # Under DP a loss or an accuracy computed on clean features would be a release the
            # ledger does not count: the worker keeps them to itself (result file, stdout). A
            # passive party (GLASU B.2) has no metric at all.
            service.report_metrics(
                info.pass_index,
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
                    "pass": info.pass_index,
                    "round": info.round,
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
        if self.keeper is not None:
            self.keeper.observe(info.model_dump(by_alias=True), outcome)

    def _save(self, progress: WorkerProgress) -> None:
        if self.checkpoints is not None:
            assert self.fingerprint is not None
            self.checkpoints.save(self.client, progress, self.fingerprint)

    def _masked_without_this_client(self, info: PassInfo) -> bool:
        """Under masks and stragglers "continue", a pass stated without this client (it was
        left out of a pass before and is not back yet): it takes no part in it and rejoins, as
        after a 409. Under "wait" the same statement is a lie, which the codec refuses."""
        if self.config.stragglers != "continue" or info.participants is None:
            return False
        return self.service.client_index not in info.participants

    def _went_on_without(self, refusal: ServiceError) -> bool:
        """Whether the service refused a pass because it went on without this client
        (stragglers "continue"): it was excluded, or the session has passed it by."""
        if self.config.stragglers != "continue" or refusal.status != 409:
            return False
        return refusal.slug in ("excluded", "wrong-pass")


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
