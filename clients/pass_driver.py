"""One pass of a worker: the sans-IO client's requests (``models/federated.py``) answered with
calls to the service, every share of a private session through the owner's release gate first,
and with checkpoints each share's plaintext digest journaled before it leaves."""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from clients.checkpoint import CheckpointError, CheckpointStore, journal_key
from clients.policy import ReleaseGate
from clients.service_http import ServiceError
from clients.session_client import SessionClient
from models.federated import GlasuClient
from models.outcome import PassOutcome
from secure.protocol import NodesRequest, Request, Response, ShareRequest, SharesSum
from secure.wire.passes import PassInfo

log = logging.getLogger(__name__)

Result = TypeVar("Result")


@dataclass(frozen=True)
class ResumedPass:
    """The pass a resumed worker recomputes first, and the plaintext digests of the shares'
    parts it had journaled for that pass before it stopped (``{journal_key(layer, part):
    sha256}``)."""

    pass_index: int
    shares: Mapping[str, str]


@dataclass(frozen=True)
class PassDriver:
    """What a worker answers its client's requests with: the ``service``; in a private
    session the owner's release ``gate``, which every share passes first; its ``checkpoints``
    (each share's plaintext digest journaled before it leaves); and, after a restart, the pass
    it recomputes (``resume``)."""

    service: SessionClient
    gate: ReleaseGate | None = None
    checkpoints: CheckpointStore | None = None
    resume: ResumedPass | None = None
    # the answering party's answer, shared: each part counted in the owner's ledger first
    on_disclosure: Callable[[ShareRequest], None] | None = None

    def drive(self, client: GlasuClient, info: PassInfo) -> PassOutcome:
        """Answer the client's requests of pass ``info`` with calls to the service."""
        if info.kind == "done":
            raise ValueError(f"pass {info.pass_index} is not a pass to run: the session is done")
        pass_index = info.pass_index
        # a masked codec checks the service's participants here, before anything leaves
        client.joint.codec.begin_pass(pass_index, info.participants)
        steps = client.run_pass(
            pass_index=pass_index,
            kind=info.kind,
            output_nodes=np.asarray(info.output_nodes, dtype=np.int64),
        )
        return self.answer(steps, info, encoding=client.joint.codec.encoding)

    def answer(
        self, steps: Generator[Request, Response, Result], info: PassInfo, *, encoding: str
    ) -> Result:
        """Answer the requests of ``steps`` (a sans-IO pass of pass ``info``, whose shares are
        encoded as ``encoding``) with calls to the service; what ``steps`` returns."""
        pass_index = info.pass_index
        answer: Any = None
        while True:
            try:
                request = steps.send(answer) if answer is not None else next(steps)
            except StopIteration as finished:
                return finished.value
            if isinstance(request, NodesRequest):
                answer = self.service.exchange_nodes(pass_index, request.layer, request.nodes)
            elif isinstance(request, ShareRequest):
                if self.gate is not None and not request.disclosure:
                    admit_release(self.gate, pass_index, request, pass_kind=info.kind)
                if request.disclosure and self.on_disclosure is not None:
                    self.on_disclosure(request)
                answer = self.exchange_share(pass_index, request, encoding=encoding)
            else:
                raise TypeError(f"unexpected request {request!r}")

    def exchange_share(self, pass_index: int, request: ShareRequest, *, encoding: str) -> SharesSum:
        """Upload a share's part, encoded as ``encoding`` (with checkpoints, the digest of its
        plaintext that the request carries journaled first), and fetch the part's sum. In the
        pass a resumed worker recomputes, a slot (a layer's part) that already holds this
        worker's share from before the crash (409 ``conflict``: CKKS encrypts the same
        plaintext to other bytes) is taken over when the recomputed plaintext is the journaled
        one: the sum then holds exactly this share, and Extract(sum, share) is what the
        uninterrupted run computed."""
        service, resume = self.service, self.resume
        digest = request.plaintext_digest
        if self.checkpoints is not None and digest is not None:
            self.checkpoints.record_upload(pass_index, request.layer, digest, part=request.part)
        where = f"pass {pass_index}, layer {request.layer}" + (
            f", part {request.part} of {request.parts}" if request.parts > 1 else ""
        )
        try:
            service.put_share(
                pass_index,
                request.layer,
                request.payload,
                rows=request.rows,
                cols=request.cols,
                encoding=encoding,
                part=request.part,
                parts=request.parts,
            )
        except ServiceError as exc:
            if exc.status != 409 or exc.slug != "conflict" or resume is None:
                raise
            if resume.pass_index != pass_index:
                raise
            before = resume.shares.get(journal_key(request.layer, request.part))
            if before is None or before != digest:
                raise CheckpointError(
                    f"{where}: the service holds a share this "
                    "worker uploaded before it stopped, and the share it recomputed from its "
                    "checkpoint "
                    + ("is not in its upload journal" if before is None else "differs from it")
                    + " (another --threads or device, or a damaged journal?): the pass cannot be "
                    "completed correctly"
                ) from exc
            log.info(
                "%s: the service holds this worker's share from before the restart (the same "
                "plaintext); taking its sum",
                where,
            )
        return service.fetch_sum(pass_index, request.layer, part=request.part)


def admit_release(
    gate: ReleaseGate, pass_index: int, request: ShareRequest, *, pass_kind: str | None = None
) -> None:
    """Every share of a private session is a release: it passes the owner's gate before it
    leaves (:class:`BudgetSpent` if it would go past the policy). A share's parts are one
    release (they carry its digest): the gate admits it at part 0, the parts after it follow."""
    if request.release is None:
        raise RuntimeError("a share of a private session without the digest of its release")
    if request.part != 0:
        return
    if not gate.admit(
        pass_index, layer=request.layer, release=request.release, pass_kind=pass_kind
    ):
        log.info(
            "pass %d, layer %d: the same release as before (the same inputs, hence the same "
            "noise): not counted twice",
            pass_index,
            request.layer,
        )
