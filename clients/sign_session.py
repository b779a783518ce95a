"""A worker's private sign session over the service (docs/privacy.md 3.8): a session of kind
"release" is ONE pass, in which each releasing worker uploads its released block over every
aligned node (``models.private_sign``) as its share, encrypted and in parts through its owner's
release gate, as an evaluation pass's share travels; it gets the sum, keeps the others' blocks
(the sum less its own share) and, where it holds labels, trains its sign head locally for the
session's rounds with no more passes, and with ``--model-out`` keeps its model (its head's
best round, its noisy release). The owner's ledger counts one release; a plan that asks
for more passes is refused before anything leaves (:func:`check_one_release`), and a service
that offers a second pass after the release is refused too (:func:`check_done`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clients.pass_driver import PassDriver
from clients.policy import PolicyRefusal
from clients.rejoin import stated_pass_info
from clients.session_client import SessionClient
from clients.session_fit import SessionMismatch
from models.client_config import ClientConfig
from models.config import PRECOMPUTED_BACKBONES
from models.data.partition import ClientPartition
from models.data.propagation import HopFeatures
from models.joint import JointAggregation
from models.keeper import ModelKeeper
from models.outcome import PassOutcome
from models.private import noise_source
from models.private_sign import (
    RELEASE_PASS,
    SignRelease,
    clean_release,
    exchange_release,
    make_receiver,
    receiver_config,
    receiver_outcome,
    release_settings,
    released_block,
)
from models.private_sign_kept import KeptRelease
from models.private_sign_model import save_sign_model
from secure.aggregation import EmbeddingCodec
from secure.privacy import RELEASE_LAYER, SessionPrivacy
from secure.protocol import ProtocolViolation, part_rows
from secure.release_noise import ReleaseKeyedNoise, ReleaseMechanism, release_digest
from secure.schedule import PassSpec, SessionSchedule
from secure.wire.passes import PassInfo
from secure.wire.sessions import SessionConfigView

CPU = torch.device("cpu")


def check_one_release(session: Mapping[str, Any], privacy: SessionPrivacy) -> None:
    """:class:`PolicyRefusal` unless the session (``GET /v1/sessions/{id}``) plans exactly one
    pass, the release: the private sign design releases this data once, whatever the service
    says."""
    passes = session.get("passes_total")
    if passes != 1 or privacy.planned_releases != 1:
        raise PolicyRefusal(
            f"the release session plans {passes} passes: the private sign design releases "
            "this data once (one pass, docs/privacy.md 3.8), and this worker refuses a plan "
            "that asks it for more"
        )


def check_release_session(
    session: Mapping[str, Any], privacy: SessionPrivacy | None
) -> SessionPrivacy:
    """What a worker checks of a release session before anything leaves: it is private and it
    plans one release (:func:`check_one_release`)."""
    if privacy is None:
        raise SessionMismatch("a release session (the private sign design) needs privacy")
    check_one_release(session, privacy)
    return privacy


def check_done(info: PassInfo) -> None:
    """After the release the session is done: a service that offers another pass asks this
    worker to release its data again, which it refuses (:class:`ProtocolViolation`)."""
    if info.kind != "done":
        raise ProtocolViolation(
            f"the service offers pass {info.pass_index} ({info.kind}) after the release of a "
            "release session: the private sign design releases this data once; refusing"
        )


@dataclass
class SignWorker:
    """This worker's part of a release session: its partition as the session uses it, its
    client settings (the session's with its options), the session, its privacy plan, its codec
    and its noise (release-keyed, or seeded for tests: ``noise_seed``)."""

    partition: ClientPartition
    config: ClientConfig
    session: SessionConfigView
    privacy: SessionPrivacy
    codec: EmbeddingCodec
    noise: ReleaseKeyedNoise | None
    noise_seed: int | None
    device: torch.device | str = "cpu"
    keeps_model: bool = False  # its head's best round is kept (``--model-out``)
    finished: str | None = None  # why the session ended, once its one pass is done
    kept_h1: torch.Tensor | None = None  # its noisy release H1, once released
    keeper: ModelKeeper | None = None  # its head's best round, once it trains

    def __post_init__(self) -> None:
        model = self.config.model
        if model.backbone not in PRECOMPUTED_BACKBONES:
            raise SessionMismatch(
                "a release session runs the private sign design (docs/privacy.md 3.8): its "
                f"workers run --backbone sign, this one {model.backbone}"
            )
        if self.block_width % model.hops:
            raise SessionMismatch(
                f"the session's release is {self.block_width} columns wide, not a multiple of "
                f"this worker's --hops {model.hops}: the session's hops (its worker defaults) "
                "must be every worker's"
            )

    @property
    def block_width(self) -> int:
        """Columns of the released block: the release's width times the hops."""
        return self.session.agg_layers[0].width

    @property
    def width(self) -> int:
        return self.block_width // self.config.model.hops

    @property
    def client(self) -> int:
        return self.partition.client

    @property
    def receives(self) -> bool:
        """Whether it trains on the others' blocks: it holds labels."""
        return self.session.label_holder in (None, self.client)

    @property
    def releases(self) -> bool:
        """Whether a receiver other than itself reads its block (``models.private_sign.
        senders``): not the label holder that has the only labels."""
        holder = self.session.label_holder
        return self.session.clients > 1 and holder != self.client

    @property
    def mechanism(self) -> ReleaseMechanism:
        return ReleaseMechanism.of(
            self.privacy, width=self.block_width, encoding=self.codec.encoding
        )

    def release(self, driver: PassDriver, info: PassInfo) -> HopFeatures:
        """The session's one pass: this worker's block (or zeros where it releases nothing)
        up, the sum down; the others' blocks."""
        if info.pass_index != RELEASE_PASS or info.kind != "eval":
            raise ProtocolViolation(
                f"a release session's one pass is pass {RELEASE_PASS} (an evaluation pass), "
                f"the service offers pass {info.pass_index} ({info.kind})"
            )
        block, digest = self._block(np.asarray(info.output_nodes, dtype=np.int64))
        joint = JointAggregation(
            self.codec, clients=self.session.clients, part_values=self.session.part_values,
            device=CPU,
        )  # fmt: skip
        self.codec.begin_pass(RELEASE_PASS, info.participants)
        steps = exchange_release(
            joint, block, rows=self.partition.num_nodes, width=self.width,
            hops=self.config.model.hops, release=digest,
        )  # fmt: skip
        return driver.answer(steps, info, encoding=self.codec.encoding)

    def _block(self, output_nodes: np.ndarray) -> tuple[HopFeatures | None, str | None]:
        """Its released block and the release's digest (what keys its noise and what the gate
        records), or nothing where it releases nothing."""
        if not self.releases:
            return None, None
        seed, settings = self.session.seed, self.settings
        clean = clean_release(self.partition, settings, seed=seed)
        key = release_digest(
            pass_index=RELEASE_PASS,
            layer=RELEASE_LAYER,
            output_nodes=output_nodes,
            rows=np.arange(self.partition.num_nodes, dtype=np.int64),
            clean=clean.numpy(),
            mechanism=self.mechanism,
            part_rows=part_rows(self.block_width, self.session.part_values),
        )
        noise = (
            self.noise.for_release(key)
            if self.noise is not None
            else noise_source(noise_seed=self.noise_seed, client=self.client)
        )
        block = released_block(
            self.partition, settings, hops=self.config.model.hops, noise=noise, seed=seed,
            clean=clean,
        )  # fmt: skip
        self.kept_h1 = block.hops[0]  # the release itself (before its K - 1 hops)
        return block, key.hex()

    @property
    def settings(self) -> SignRelease:
        seed = self.session.seed
        return release_settings(self.privacy, width=self.width, seed=seed, party=self.client)

    def session_passes(
        self, service: SessionClient, driver: PassDriver, masked: bool
    ) -> Iterator[tuple[PassInfo, PassOutcome]]:
        """The session's one pass (the release), the check that the service offers no other
        (:func:`check_done`), then each local pass, as pass 0's post-processing (its epsilon);
        :attr:`finished` then holds why the session ended."""
        info = (
            stated_pass_info(service, RELEASE_PASS) if masked else service.pass_info(RELEASE_PASS)
        )
        received = self.release(driver, info)
        after = service.pass_info(info.pass_index + 1)
        check_done(after)
        self.finished = after.reason or "finished"
        for spec, outcome in self.local_passes(received):
            local = {"pass": info.pass_index, "kind": spec.kind, "round": spec.round}
            yield PassInfo.model_validate({**local, "output_nodes": []}), outcome

    def local_passes(self, received: HopFeatures) -> Iterator[tuple[PassSpec, PassOutcome]]:
        """The session's rounds, trained and evaluated here on the received blocks (no pass
        through the service: post-processing of the release), each beside the party-alone
        reference; a party without labels only counts them (no metric)."""
        partition, session = self.partition, self.session
        schedule = SessionSchedule.create(
            rounds=session.rounds,
            eval_every=session.eval_every,
            train_nodes=partition.train_nodes,
            eval_nodes=np.union1d(partition.val_nodes, partition.test_nodes),
            batch_size=session.batch_size,
            seed=session.seed,
        )
        if not self.receives:
            for spec in schedule.passes:
                yield spec, PassOutcome(kind=spec.kind, loss=float("nan"))
            return
        local = receiver_config(self.config)
        receiver = make_receiver(partition, local, received, device=torch.device(self.device))
        if self.keeps_model:
            self.keeper = ModelKeeper(receiver.client, private=True)
        for spec in schedule.passes:
            nodes = schedule.output_nodes(spec.index)
            outcome = receiver_outcome(
                receiver, pass_index=spec.index, kind=spec.kind, output_nodes=nodes
            )
            if self.keeper is not None:
                info = {"pass": spec.index, "round": spec.round, "output_nodes": nodes}
                self.keeper.observe(info, outcome)
            yield spec, outcome

    def save_model(
        self,
        directory: Path,
        *,
        own_ids: np.ndarray | None,
        session_id: str,
        session_config: Mapping[str, Any],
        alignment_digest: str | None,
        spent: dict[str, Any] | None,
    ) -> Path:
        """Keep this party's private sign model (models/private_sign_model.py): its head's
        best round where it holds labels, its noisy release (its rows keyed by ``own_ids``)
        where it released one."""
        kept = None if self.kept_h1 is None else KeptRelease.of(self.kept_h1, own_ids)
        return save_sign_model(
            directory, partition=self.partition, config=self.config, keeper=self.keeper,
            release=self.settings, kept=kept, last_round=self.session.rounds,
            session_config=session_config, session_id=session_id,
            alignment_digest=alignment_digest, privacy=self.privacy, spent=spent,
        )  # fmt: skip
