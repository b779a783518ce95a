"""A worker's scoring session of a kept private sign model (docs/privacy.md 3.8, "Keeping and
scoring"): ONE pass, post-processing of each sender's kept release. A sender computes its block
over its current table from its kept ``H1`` alone (``models.private_sign_model.
scored_block_rows``: new customers' rows filled from their covered neighbours, their own
features never read) and uploads the rows of the scored nodes through the service's sum; the
answering party computes its kept head on its own hops beside the others' rows and writes the
model's answer. Where the session shares it (``share_predictions: label-holder``, agreed by the
answering party's owner), the answer then goes through the same pass as every design's does
(``models.answer.share_answer``: a sum at layer L + 1 to which the partners add zeros, each part
counted in the answering party's ledger as predictions shared before it leaves), and the partners
write it in their own ids.

The owner's guarantee holds whatever the service says: the worker computes no release in such a
session, so its ledger records the session with no release (naming the training session whose
release it post-processes), and a service that asks for more is refused (another block width at
join, :func:`check_scoring_session`; a second pass after the one pass, :func:`check_one_pass`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Hashable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from clients.owner_ledger import OwnerLedger, SessionAbout
from clients.pass_driver import PassDriver
from clients.rejoin import stated_pass_info
from clients.session_client import SessionClient
from clients.session_fit import SessionMismatch
from models.answer import Answer, share_answer
from models.artefact import SavedModel
from models.client_config import ClientConfig
from models.data.derived import kept_release_block
from models.data.partition import ClientPartition
from models.joint import JointAggregation
from models.outcome import PassOutcome
from models.private_sign import RELEASE_PASS, exchange_rows
from models.private_sign_kept import KeptRelease
from models.private_sign_model import (
    block_rows,
    kept_head_outcome,
    kept_release,
    scored_block_rows,
)
from secure.aggregation import EmbeddingCodec
from secure.protocol import ProtocolViolation, Request, Response, answering_party
from secure.wire.passes import PassInfo
from secure.wire.sessions import SessionConfigView

CPU = torch.device("cpu")


def check_scoring_session(
    session: SessionConfigView, model: SavedModel, *, passes_total: int
) -> None:
    """:class:`SessionMismatch` unless the session is one pass over blocks as wide as the kept
    release's (its width times its hops): a session that asks for another width or more passes
    asks for what only a new release could give. (Its answer, where the session shares it, is
    no release: the answering party's worker counts it as predictions shared.)"""
    sign = model.manifest["sign_release"]
    kept_width = int(sign["width"]) * int(sign["hops"])
    asked = session.agg_layers[0].width
    if passes_total != 1 or asked != kept_width or len(session.agg_layers) != 1:
        raise SessionMismatch(
            f"the scoring session asks for {passes_total} passes of blocks {asked} columns wide,"
            f" the kept release gives one pass of {kept_width}: a private sign model scores by "
            "post-processing of its one kept release, and this worker releases nothing new"
        )


def check_one_pass(info: PassInfo) -> None:
    """After its one pass the session is done: a service that offers another asks for what
    only a new release could give, which this worker refuses (:class:`ProtocolViolation`)."""
    if info.kind != "done":
        raise ProtocolViolation(
            f"the service offers pass {info.pass_index} ({info.kind}) after the one pass of a "
            "scoring of a kept release: the private sign design post-processes its one release "
            "and releases nothing new; refusing"
        )


def note_scoring(
    ledger: OwnerLedger | None, session_id: str, model: SavedModel, session: SessionConfigView
) -> None:
    """The owner's ledger records the session with no release, and the training session whose
    release it post-processes (the model's, not the service's word)."""
    if ledger is None:
        return
    about = SessionAbout(
        label=session.label, partners=session.partners, operator=session.operator,
        kind="scoring", clients=session.clients, encoding=session.encoding,
        post_processes=str(model.manifest["session_id"]),
    )  # fmt: skip
    ledger.note_session(session_id, about)


@dataclass
class KeptSignScorer:
    """This worker's part of a scoring session of its kept private sign ``model``: its current
    partition, its client settings (the model's), the session, its codec, each current aligned
    node's key (``own_ids``: the party's own id, or the node index of a benchmark dataset)."""

    partition: ClientPartition
    config: ClientConfig
    session: SessionConfigView
    model: SavedModel
    codec: EmbeddingCodec
    own_ids: np.ndarray
    device: torch.device | str = "cpu"
    finished: str | None = None  # why the session ended, once its one pass is done
    kept: KeptRelease | None = None  # its kept release (a sender's)
    # a request of an online session: each pass the service states is checked against the
    # signed request (``clients.request_signing.RequestCheck.check_pass``)
    check_pass: Callable[[PassInfo], None] | None = None
    # what names ``own_ids`` (where the worker read them, loaded with its partition): its kept
    # block is then computed once for every request of an online worker; None: each session
    keys: Hashable | None = None

    def __post_init__(self) -> None:
        self.kept = kept_release(self.model)

    @property
    def receives(self) -> bool:
        """Whether it answers: the answering party (its kept head predicts)."""
        return self.partition.client == answering_party(self.session.label_holder)

    def session_passes(
        self, service: SessionClient, driver: PassDriver, masked: bool
    ) -> Iterator[tuple[PassInfo, PassOutcome]]:
        """The one pass (its kept block's rows of the scored nodes up, the sum down; the
        answering party's answer, where the session shares it), then the check that the service
        offers no other."""
        info = stated_pass_info(service, RELEASE_PASS) if masked else service.pass_info(0)
        if info.pass_index != RELEASE_PASS or info.kind != "eval":
            raise ProtocolViolation(
                f"a scoring session's one pass is pass {RELEASE_PASS} (an evaluation pass), "
                f"the service offers pass {info.pass_index} ({info.kind})"
            )
        nodes = np.asarray(info.output_nodes, dtype=np.int64)
        if nodes.size and (nodes.min() < 0 or nodes.max() >= self.partition.num_nodes):
            raise ProtocolViolation("the pass's output nodes are not aligned nodes")
        self._checked(info)
        outcome = driver.answer(self._pass(nodes, info), info, encoding=self.codec.encoding)
        after = service.pass_info(info.pass_index + 1)
        self._checked(after)
        check_one_pass(after)
        self.finished = after.reason or "finished"
        yield info, outcome

    def _pass(self, nodes: np.ndarray, info: PassInfo) -> Generator[Request, Response, PassOutcome]:
        """The pass's exchanges (sans-IO): this worker's kept block's rows of ``nodes`` (zeros
        where it released nothing) up, the others' rows down; the answering party's kept head
        on them; then, where the session shares it, the answer through the service
        (``models.answer.share_answer``: the partners receive it)."""
        kept = self.kept
        rows_of = None
        if kept is not None:
            block = self._block_rows(kept, nodes)

            def rows_of(start: int, stop: int) -> np.ndarray:
                return block[start:stop]

        joint = JointAggregation(
            self.codec, clients=self.session.clients, part_values=self.session.part_values,
            device=CPU,
        )  # fmt: skip
        self.codec.begin_pass(RELEASE_PASS, info.participants)
        others = yield from exchange_rows(
            joint, rows_of, nodes=nodes, cols=self.session.agg_layers[0].width, release=None,
            disclosure=False,
        )  # fmt: skip
        outcome, answer = PassOutcome(kind="eval", loss=float("nan")), None
        if self.receives:
            outcome = kept_head_outcome(
                self.model, self.partition, self.config, others, nodes=nodes, device=self.device
            )
            assert outcome.probabilities is not None
            answer = Answer.of(outcome.probabilities)
        width = self.config.shared_answer_width
        if width is not None:
            answer = yield from share_answer(
                joint, answer, layer=self.session.layers + 1, pass_index=RELEASE_PASS,
                rows=len(nodes), width=width,
            )  # fmt: skip
        return dataclasses.replace(outcome, answer=answer)

    def _checked(self, info: PassInfo) -> None:
        if self.check_pass is not None:
            self.check_pass(info)

    def _block_rows(self, kept: KeptRelease, nodes: np.ndarray) -> np.ndarray:
        """Its kept block's rows of ``nodes``: the block over the current table computed once
        per partition where the keys are named (``keys``), else for this session."""
        hops = self.config.model.hops
        if self.keys is None:
            return scored_block_rows(kept, self.own_ids, self.partition, hops=hops, nodes=nodes)
        block = kept_release_block(
            self.partition, kept, self.own_ids, hops=hops, keys=self.keys,
            release=str(self.model.manifest["sign_release"]["sha256"]),
        )  # fmt: skip
        return block_rows(block, nodes)
