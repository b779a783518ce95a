"""A worker's checkpoint: what it needs to compute its next pass exactly as if it never stopped.

After every completed pass the worker writes, atomically (a temporary file in the same folder,
``fsync``, ``os.replace``, ``fsync`` of the folder), one file per (session, client)::

    <checkpoint dir>/<session id>-client<m>.pt

holding the model and optimiser state, the client's dropout generator, the CELU-VFL workset
(the cached batches of the last W rounds: with W > 1 the local steps of later rounds reuse
them), for the private client also its party-alone reference model, optimiser and generator,
and the state of its DP noise (below); the next pass index; the worker's own counters and
history (for its result file); and a fingerprint of the session and of this worker's settings,
so that a checkpoint of another session, client, data or model is refused with a message that
says what differs. A file that is not a checkpoint, or is damaged, is refused too: nothing is
half-restored.

A pass that was cut short is recomputed from the checkpoint, bit for bit: node samples are
seeded per pass, dropout masks come from the restored generator, and the DP noise is the same:

- cryptographic noise (``secure.release_noise.ReleaseKeyedNoise``) is derived from the worker's
  secret (kept in its privacy ledger, never in a checkpoint) and the digest of everything the
  release depends on. A recomputed pass with the same inputs therefore sends the identical
  release (the local ledger counts it once), and its Extract ``H - share / M`` uses the noise the
  service's sum holds; a pass the service answers differently this time is another release,
  with independent noise, and the ledger counts it. Nothing about the noise is saved here;
- reproducible test noise (``--noise-seed``): the generator's state.

Before each share is uploaded, the SHA-256 of its plaintext is written to a small upload
journal beside the checkpoint (``<session id>-client<m>.uploads.json``). When a resumed worker
finds its slot already filled (the service refuses a different body for an occupied slot, and
CKKS ciphertexts of the same plaintext differ in bytes), it takes the sum only if the share it
recomputed has the journaled plaintext: then the sum holds exactly that share and the Extract is
correct; otherwise it stops with a message instead of training on a wrong Extract.

The checkpoint holds the model trained on this organisation's data: keep the folder as private
as the data itself (it lives beside it by default).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.federated import GlasuClient
from models.partition import ClientPartition
from models.private import PrivateGlasuClient
from models.workset import CachedBatch
from secure.aggregation import EmbeddingCodec
from secure.files import atomic_write
from secure.release_noise import ReleaseKeyedNoise

log = logging.getLogger(__name__)

CHECKPOINT_KIND = "glasu-worker-checkpoint"
CHECKPOINT_FORMAT = 2  # 2: no noise keys (release-keyed noise)
CHECKPOINT_DIRNAME = "checkpoints"


class CheckpointError(RuntimeError):
    """A checkpoint this worker cannot resume from, or cannot write; the message says why and
    what to do."""


# -- the fingerprint ----------------------------------------------------------------------------


def data_digest(partition: ClientPartition) -> str:
    """SHA-256 of the partition's features, edges and labels (the data the model was fit to),
    and of which aligned nodes it holds, if not all."""
    digest = hashlib.sha256()
    held = getattr(partition, "held", None)
    for value in (partition.features, partition.edge_index, partition.labels, held):
        if value is None:
            continue
        array = np.ascontiguousarray(
            value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
        )
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


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
                    "data": data_digest(partition),
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


# -- the noise ----------------------------------------------------------------------------------


def _noise_state(client: GlasuClient) -> dict[str, Any] | None:
    if not isinstance(client, PrivateGlasuClient):
        return None
    noise = client.release.noise
    if isinstance(noise, ReleaseKeyedNoise):
        return {"kind": "release-keyed"}  # a function of each release: nothing to save
    rng = getattr(noise, "_rng", None)  # GaussianNoise(seed=...): tests and experiments only
    if isinstance(rng, np.random.Generator):
        return {"kind": "seeded", "state": rng.bit_generator.state}
    raise CheckpointError(
        f"cannot checkpoint the noise source {noise!r}: a resumed pass must draw the noise of "
        "the release it repeats (run without checkpoints, --no-checkpoint)"
    )


def _restore_noise(client: GlasuClient, state: Mapping[str, Any] | None) -> None:
    private = isinstance(client, PrivateGlasuClient)
    if state is None or not private:
        if private or state is not None:
            raise CheckpointError(
                "the checkpoint and this worker disagree on differential privacy (one has a "
                "noise state, the other none)"
            )
        return
    assert isinstance(client, PrivateGlasuClient)
    noise = client.release.noise
    if state["kind"] == "release-keyed" and isinstance(noise, ReleaseKeyedNoise):
        return
    if state["kind"] == "seeded" and isinstance(getattr(noise, "_rng", None), np.random.Generator):
        noise._rng.bit_generator.state = state["state"]  # type: ignore[attr-defined]
        return
    raise CheckpointError(
        f"the checkpoint's noise ({state['kind']}) does not fit this worker's noise "
        f"source {noise!r}: --noise-seed differs between the runs?"
    )


# -- the client's state -------------------------------------------------------------------------


#: Dataclasses of these packages may be rebuilt from a checkpoint (the workset's cached batches
#: and what they hold); anything else is refused.
_RESTORABLE_MODULES = ("models.",)


def _to_plain(value: Any, where: str) -> Any:
    """A value of the workset as tensors, numbers, lists and dicts (``torch.load`` with
    ``weights_only=True`` reads them back without running any code); a dataclass (a cached
    batch, a block, an extracted aggregate) as its class name and its fields."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        return {
            "__dataclass__": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {
                f.name: _to_plain(getattr(value, f.name), f"{where}.{f.name}")
                for f in dataclasses.fields(value)
                if f.init
            },
        }
    if isinstance(value, list | tuple):
        return [_to_plain(v, where) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v, where) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise CheckpointError(f"cannot checkpoint {where} of type {type(value).__name__}")


def _from_plain(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict) and set(value) == {"__dataclass__", "fields"}:
        cls = _restorable_class(str(value["__dataclass__"]))
        return cls(**{k: _from_plain(v, device) for k, v in value["fields"].items()})
    if isinstance(value, list):
        return [_from_plain(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _from_plain(v, device) for k, v in value.items()}
    return value


def _restorable_class(name: str) -> type:
    module_name, _, qualname = name.partition(":")
    if not module_name.startswith(_RESTORABLE_MODULES):
        raise CheckpointError(f"the checkpoint names a class {name!r} it may not hold")
    try:
        cls = getattr(importlib.import_module(module_name), qualname)
    except (ImportError, AttributeError) as exc:
        raise CheckpointError(f"the checkpoint holds a {name} this version lacks") from exc
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise CheckpointError(f"the checkpoint names {name!r}, which is not a dataclass")
    return cls


def _workset_state(client: GlasuClient) -> dict[str, Any]:
    workset = client.workset
    batches = [_to_plain(batch, "the workset") for batch in workset._batches]
    return {"capacity": workset.capacity, "step": workset._step, "batches": batches}


def _restore_workset(client: GlasuClient, state: Mapping[str, Any]) -> None:
    workset = client.workset
    if state["capacity"] != workset.capacity:
        raise CheckpointError(
            f"the checkpoint's workset holds {state['capacity']} rounds, this worker's "
            f"{workset.capacity} (--cache-rounds differs)"
        )
    batches = [_from_plain(batch, client.device) for batch in state["batches"]]
    if not all(isinstance(batch, CachedBatch) for batch in batches):
        raise CheckpointError("the checkpoint's workset holds something other than batches")
    workset._batches = batches
    workset._step = int(state["step"])


def client_state(client: GlasuClient) -> dict[str, Any]:
    """Everything of ``client`` that changes from pass to pass."""
    state: dict[str, Any] = {
        "network": client.network.state_dict(),
        "optimizer": client.optimizer.state_dict(),
        "generator": client.generator.get_state(),
        "workset": _workset_state(client),
        "noise": _noise_state(client),
        "reference": None,
    }
    if isinstance(client, PrivateGlasuClient):
        state["reference"] = {
            "network": client.reference.state_dict(),
            "optimizer": client.reference_optimizer.state_dict(),
            "generator": client.reference_generator.get_state(),
        }
    return _to_cpu(state)


def restore_client_state(client: GlasuClient, state: Mapping[str, Any]) -> None:
    """Put ``state`` (from :func:`client_state`) into a client built with the same settings."""
    client.network.load_state_dict(state["network"])
    client.optimizer.load_state_dict(state["optimizer"])
    client.generator.set_state(state["generator"])
    _restore_workset(client, state["workset"])
    reference = state.get("reference")
    if isinstance(client, PrivateGlasuClient) != (reference is not None):
        raise CheckpointError("the checkpoint and this worker disagree on the private arrangement")
    if isinstance(client, PrivateGlasuClient):
        assert reference is not None
        client.reference.load_state_dict(reference["network"])
        client.reference_optimizer.load_state_dict(reference["optimizer"])
        client.reference_generator.set_state(reference["generator"])
    _restore_noise(client, state.get("noise"))


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


# -- the worker's own progress --------------------------------------------------------------


@dataclass
class WorkerProgress:
    """The worker's counters and history up to ``next_pass`` (restored into its result)."""

    next_pass: int = 0
    passes: int = 0
    training_bytes: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    training_losses: list[float] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)  # the pass of every resume


@dataclass(frozen=True)
class Restored:
    progress: WorkerProgress
    path: Path


# -- the store ------------------------------------------------------------------------------------


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
        payload = {
            "kind": CHECKPOINT_KIND,
            "format": CHECKPOINT_FORMAT,
            "fingerprint": dict(fingerprint.parts),
            "digest": fingerprint.digest,
            "progress": dataclasses.asdict(progress),
            "client": client_state(client),
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
            with torch.sparse.check_sparse_tensor_invariants():
                payload = torch.load(self.path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise
        except Exception as exc:  # random bytes can make the unpickler raise anything at all
            raise CheckpointError(
                f"the checkpoint {self.path} is damaged or not a glasu checkpoint ({exc}); move "
                "it away to start this worker over, or restore an intact copy"
            ) from exc
        if not isinstance(payload, dict) or payload.get("kind") != CHECKPOINT_KIND:
            raise CheckpointError(f"{self.path} is not a glasu worker checkpoint")
        if payload.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(
                f"the checkpoint {self.path} has format {payload.get('format')}, this worker "
                f"reads format {CHECKPOINT_FORMAT}"
            )
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
                + " (checkpoint != this worker). Resume with the settings of that run, or give "
                "another --checkpoint folder"
            )
        try:
            restore_client_state(client, payload["client"])
            progress = WorkerProgress(**payload["progress"])
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(
                f"the checkpoint {self.path} does not fit this worker's model: {exc}"
            ) from exc
        return Restored(progress=progress, path=self.path)

    # -- the upload journal -------------------------------------------------------------------

    def record_upload(self, pass_index: int, layer: int, digest: str) -> None:
        """Note the plaintext digest of a share before it is uploaded (synced to disk)."""
        journal = self.uploads()
        shares = journal["shares"] if journal.get("pass") == pass_index else {}
        shares[str(layer)] = digest
        body = {"session_id": self.session_id, "client": self.client, "pass": pass_index}
        atomic_write(self.journal_path, _canonical({**body, "shares": shares}))

    def uploads(self) -> dict[str, Any]:
        """The journal: ``{"pass": p, "shares": {layer: sha256}}`` (empty if none or unusable:
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


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def default_checkpoint_dir(data: Path) -> Path:
    """``checkpoints/`` inside the worker's data folder, beside its local privacy ledger."""
    return Path(data) / CHECKPOINT_DIRNAME


# -- the digest of what is uploaded ---------------------------------------------------------------


class DigestingCodec(EmbeddingCodec):
    """The worker's codec, noting the SHA-256 of the plaintext of each share it encodes (what
    the upload journal records and a resumed worker compares)."""

    def __init__(self, inner: EmbeddingCodec) -> None:
        self.inner = inner
        self.encoding = inner.encoding
        self.last_digest: str | None = None

    def encode(self, matrix: np.ndarray) -> bytes:
        array = np.ascontiguousarray(matrix, dtype=np.float32)
        self.last_digest = hashlib.sha256(f"{array.shape}".encode() + array.tobytes()).hexdigest()
        return self.inner.encode(matrix)

    def decode_sum(self, payload: bytes, *, rows: int, cols: int) -> np.ndarray:
        return self.inner.decode_sum(payload, rows=rows, cols=cols)

    def value_bound(self, *, shares: int) -> float:
        return self.inner.value_bound(shares=shares)
