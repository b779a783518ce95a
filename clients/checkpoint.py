"""A worker's checkpoint: what it needs to compute its next pass exactly as if it never stopped.

After every completed pass the worker writes, atomically (``secure.files.atomic_write``), one
file per (session, client)::

    <checkpoint dir>/<session id>-client<m>.pt

holding the client's state (``GlasuClient.state_dict``: model, optimiser, dropout generator,
the CELU-VFL workset; for the private client also its party-alone reference and the state of
its DP noise, below); the next pass index; the worker's own counters and history (for its
result file); and a fingerprint of the session and of this worker's settings, so that a
checkpoint of another session, client, data or model is refused with a message that says what
differs. A file that is not a checkpoint, or is damaged, is refused too, before anything is
restored. It is read with ``torch.load(weights_only=True)``: tensors, plain values and the
workset's own classes (``models.workset.STATE_CLASSES``), never arbitrary code.

A pass that was cut short is recomputed from the checkpoint, bit for bit: node samples are
seeded per pass, dropout masks come from the restored generator, and the DP noise is the same:

- cryptographic noise (``secure.release_noise.ReleaseKeyedNoise``) is derived from the worker's
  secret (kept in its privacy ledger, never in a checkpoint) and the digest of everything the
  release depends on and of every parameter of its noise mechanism. A recomputed pass with the
  same inputs therefore sends the identical release (the local ledger counts it once), and its
  Extract ``H - share / M`` uses the noise the service's sum holds; a pass the service answers
  differently this time is another release, with independent noise, and the ledger counts it.
  Nothing about the noise is saved;
- reproducible test noise (``--noise-seed``): the generator's state
  (``secure.noise.NoiseSource.state_dict``).

Before each share is uploaded, the SHA-256 of its plaintext (which the client's request carries:
``secure.protocol.ShareRequest.plaintext_digest``) is written to a small upload
journal beside the checkpoint (``<session id>-client<m>.uploads.json``). When a resumed worker
finds its slot already filled (the service refuses a different body for an occupied slot, and
CKKS ciphertexts of the same plaintext differ in bytes), it takes the sum only if the share it
recomputed has the journaled plaintext: then the sum holds exactly that share and the Extract is
correct; otherwise it stops with a message instead of training on a wrong Extract.

A worker without a checkpoint of its session may not come back to a session that already
released its data (``clients.policy.admit_session_id``): the checkpoint is what makes a restart
a resume of the same session with the same parameters.

The checkpoint holds the model trained on this organisation's data: keep the folder as private
as the data itself (it lives beside it by default).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from models.data.partition import ClientPartition
from models.federated import GlasuClient
from models.workset import STATE_CLASSES
from secure.files import FileFormat, atomic_write
from secure.noise import NoiseStateError

#: 3: the client's own ``state_dict`` (format 2, of glasu before it, is refused)
CHECKPOINT = FileFormat(kind="glasu-worker-checkpoint", version=3, title="glasu worker checkpoint")


class CheckpointError(RuntimeError):
    """A checkpoint this worker cannot resume from, or cannot write; the message says why and
    what to do."""


@dataclass(frozen=True)
class Fingerprint:
    """What a checkpoint belongs to: session, client, the session's configuration, this
    worker's local model settings, its share encoding and its data. JSON values only."""

    parts: Mapping[str, Any]

    @classmethod
    def of(
        cls,
        *,
        session: Mapping[str, Any],
        client: int,
        options: Any,
        encoding: str,
        partition: ClientPartition,
    ) -> Fingerprint:
        local = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else options
        return cls(
            _json_roundtrip(
                {
                    "session_id": session["session_id"],
                    "client": client,
                    "passes_total": session.get("passes_total"),
                    "session_config": session["config"],
                    "local_options": local,
                    "encoding": encoding,
                    "data": partition.digest(),
                }
            )
        )

    @property
    def digest(self) -> str:
        return hashlib.sha256(_canonical(self.parts)).hexdigest()

    def differences(self, other: Fingerprint) -> list[str]:
        """What differs between the checkpoint's (``self``) and this worker's (``other``)."""
        found = []
        for key in sorted(set(self.parts) | set(other.parts)):
            ours, theirs = self.parts.get(key), other.parts.get(key)
            if ours == theirs:
                continue
            if isinstance(ours, dict) and isinstance(theirs, dict):
                names = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
                found += [f"{key}.{n}: {ours.get(n)!r} != {theirs.get(n)!r}" for n in names[:5]]
            elif key == "data":
                found.append("data: the partition's features, edges or labels changed")
            else:
                found.append(f"{key}: {ours!r} != {theirs!r}")
        return found


def _json_roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


@dataclass
class WorkerProgress:
    """Where the worker is (``next_pass``), and its counters and history up to there (restored
    into its result)."""

    next_pass: int = 0
    resumed_from: list[int] = field(default_factory=list)  # the pass of every resume
    history: list[dict[str, Any]] = field(default_factory=list)
    training_losses: list[float] = field(default_factory=list)
    passes: int = 0
    training_bytes: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


@dataclass(frozen=True)
class Restored:
    progress: WorkerProgress
    path: Path


@dataclass
class CheckpointStore:
    """One (session, client)'s checkpoint and upload journal in ``directory``."""

    directory: Path
    session_id: str
    client: int

    @property
    def path(self) -> Path:
        return Path(self.directory) / f"{_safe(self.session_id)}-client{self.client}.pt"

    @property
    def journal_path(self) -> Path:
        return Path(self.directory) / f"{_safe(self.session_id)}-client{self.client}.uploads.json"

    def exists(self) -> bool:
        return self.path.is_file()

    # -- the checkpoint --------------------------------------------------------------------

    def save(self, client: GlasuClient, progress: WorkerProgress, fingerprint: Fingerprint) -> None:
        """Write the checkpoint for ``progress.next_pass``."""
        try:
            state = client.state_dict()
        except NoiseStateError as exc:
            raise CheckpointError(
                f"cannot checkpoint: {exc}, and a resumed pass must draw the noise of the "
                "release it repeats (run without checkpoints, --no-checkpoint)"
            ) from exc
        payload = {
            **CHECKPOINT.header(),
            "fingerprint": dict(fingerprint.parts),
            "digest": fingerprint.digest,
            "progress": dataclasses.asdict(progress),
            "client": state,
        }
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        try:
            atomic_write(self.path, buffer.getvalue())
        except OSError as exc:
            raise CheckpointError(
                f"cannot write the checkpoint {self.path}: {exc} (give a writable folder with "
                "--checkpoint DIR, or switch checkpoints off with --no-checkpoint)"
            ) from exc

    def read(self) -> dict[str, Any]:
        """The checkpoint's content, or :class:`CheckpointError` saying why it is unusable."""
        try:
            with (
                torch.serialization.safe_globals(list(STATE_CLASSES)),
                torch.sparse.check_sparse_tensor_invariants(),
            ):
                payload = torch.load(self.path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise
        except Exception as exc:  # random bytes can make the unpickler raise anything at all
            raise CheckpointError(
                f"the checkpoint {self.path} is damaged or not a glasu checkpoint ({exc}); move "
                "it away to start this worker over, or restore an intact copy"
            ) from exc
        problem = CHECKPOINT.problem(payload, name=str(self.path))
        if problem is not None:
            raise CheckpointError(f"{problem}: move it away to start this worker over")
        return payload

    def load(self, client: GlasuClient, fingerprint: Fingerprint) -> Restored:
        """Restore ``client`` from the checkpoint after checking that it is this session's,
        this client's and written with the same settings."""
        payload = self.read()
        theirs = Fingerprint(payload.get("fingerprint") or {})
        if payload.get("digest") != theirs.digest:
            raise CheckpointError(f"the checkpoint {self.path} is damaged (its fingerprint)")
        if theirs.digest != fingerprint.digest:
            differences = theirs.differences(fingerprint)
            raise CheckpointError(
                f"the checkpoint {self.path} was written by another run and is refused: "
                + "; ".join(differences or ["its fingerprint differs"])
                + " (checkpoint != this worker). Resume with the settings of that run; a"
                " session that already released this data comes back only from its own"
                " checkpoint with the same privacy parameters, so another --checkpoint folder"
                " helps only a session that has released nothing yet (docs/privacy.md 1.3)"
            )
        try:
            client.load_state_dict(payload["client"])
            progress = WorkerProgress(**payload["progress"])
        except NoiseStateError as exc:
            raise CheckpointError(
                f"the checkpoint {self.path} does not fit this worker's noise: {exc} "
                "(--noise-seed differs between the runs?)"
            ) from exc
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(
                f"the checkpoint {self.path} does not fit this worker's model: {exc}"
            ) from exc
        return Restored(progress=progress, path=self.path)

    # -- the upload journal -------------------------------------------------------------------

    def record_upload(self, pass_index: int, layer: int, digest: str, *, part: int = 0) -> None:
        """Note the plaintext digest of a share's part before it is uploaded (synced to disk)."""
        journal = self.uploads()
        shares = journal["shares"] if journal.get("pass") == pass_index else {}
        shares[journal_key(layer, part)] = digest
        body = {"session_id": self.session_id, "client": self.client, "pass": pass_index}
        atomic_write(self.journal_path, _canonical({**body, "shares": shares}))

    def uploads(self) -> dict[str, Any]:
        """The journal: ``{"pass": p, "shares": {journal_key(layer, part): sha256}}`` (empty if
        none or unusable:
        a journal that cannot be read only means a filled slot cannot be taken over)."""
        try:
            journal = json.loads(self.journal_path.read_text())
        except (OSError, ValueError):
            return {"shares": {}}
        if (
            not isinstance(journal, dict)
            or journal.get("session_id") != self.session_id
            or journal.get("client") != self.client
            or not isinstance(journal.get("shares"), dict)
        ):
            return {"shares": {}}
        return journal


def journal_key(layer: int, part: int) -> str:
    """The upload journal's key of a share's part: ``"<layer>"`` for part 0 (a journal of a
    worker from before shares travelled in parts reads the same), ``"<layer>.<part>"`` else."""
    return str(layer) if part == 0 else f"{layer}.{part}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
