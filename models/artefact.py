"""A party's trained model, kept after training: its part of the split model and what is needed
to use and audit it (docs/data.md, "Using the model").

One folder per party::

    manifest.json     what the model is (below), for people and for the loader
    weights.pt        the network's tensors: torch.save of a state dict of tensors only, which
                      torch.load(weights_only=True) reads without running any code
    evaluation.npz    the best evaluation pass of a party with a head: aligned node indices and
                      class probabilities (stays with the party)
    claim.json        which party the folder is for: written when a worker starts training into
                      it, before any release, so that no other party's model lands there

The manifest holds the backbone and every setting needed to rebuild the network, the feature
schema of ``glasu prepare`` (column names and order, dtype, what prepare did), the session and
alignment it was trained in, who holds the labels, the privacy the training spent (from the
owner's ledger), the metrics of the kept round and which round that is, the creation time and
the glasu version. A model is only ever used with data of the same schema: a feature table with
other columns is refused naming them.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.config import PRECOMPUTED_BACKBONES
from models.metrics import describe_scores
from secure.accounting import count_releases
from secure.files import FileFormat, atomic_write
from secure.protocol import answering_party

ARTEFACT = FileFormat(kind="glasu-model", version=1, title="glasu model manifest")
MANIFEST = "manifest.json"
WEIGHTS = "weights.pt"
EVALUATION = "evaluation.npz"
CLAIM = "claim.json"


class ModelError(ValueError):
    """A model folder that cannot be used here; the message says why in one sentence."""


def glasu_version() -> str:
    try:
        return version("glasu")
    except PackageNotFoundError:  # a source tree without an install
        return "0+unknown"


@dataclass(frozen=True)
class SavedModel:
    manifest: dict[str, Any]
    weights: dict[str, torch.Tensor]
    path: Path

    @property
    def feature_names(self) -> list[str]:
        return list(self.manifest["features"]["names"])

    def check_features(self, names: Sequence[str]) -> None:
        """:class:`ModelError` naming the columns that differ from the training's schema."""
        expected = self.feature_names
        if list(names) == expected:
            return
        missing = [n for n in expected if n not in names]
        extra = [n for n in names if n not in expected]
        parts = []
        if missing:
            parts.append(f"missing {_names(missing)}")
        if extra:
            parts.append(f"not in the model {_names(extra)}")
        if not parts:
            parts.append("the same columns in another order")
        raise ModelError(
            f"the feature table does not match the model {self.path} ("
            + "; ".join(parts)
            + "): prepare the data with the columns the model was trained on"
        )


def _names(names: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def holds_model(directory: Path) -> bool:
    return (Path(directory) / MANIFEST).exists()


def model_folder_party(directory: Path) -> int | None:
    """The party a model folder is for: its model's (the manifest's party index) or, before
    the model is written, the claim's; None for a folder that does not exist or is empty.
    :class:`ModelError` for a folder holding other files (not a model folder)."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    if holds_model(directory):
        return int(read_manifest(directory)["party"]["index"])
    if (directory / CLAIM).exists():
        return _claimed_party(directory / CLAIM)
    others = sorted(p.name for p in directory.iterdir())
    if others:
        raise ModelError(
            f"holds other files than a glasu model ({_names(others, most=3)}): give an empty or "
            "new folder"
        )
    return None


def _claimed_party(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["party"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"cannot read {path} ({exc})") from exc


def claim_model_folder(directory: Path, *, party: int, session_id: str) -> None:
    """Mark ``directory`` as party ``party``'s model folder (created if missing) before any
    training starts; :class:`ModelError` naming the party that claimed it first (two workers
    started on one folder at once: the second is refused)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    claim = json.dumps({"party": party, "session_id": session_id}) + "\n"
    try:
        with open(directory / CLAIM, "x", encoding="utf-8") as handle:
            handle.write(claim)
        return
    except FileExistsError:
        owner = _claimed_party(directory / CLAIM)
    if owner != party:
        raise ModelError(
            f"{directory} is the model folder of party {owner}, not of this party ({party}): "
            "give each party its own model folder"
        )


def save_model(
    directory: Path,
    *,
    manifest: Mapping[str, Any],
    weights: Mapping[str, torch.Tensor],
    evaluation: tuple[np.ndarray, np.ndarray] | None = None,
    files: Mapping[str, bytes] | None = None,
) -> Path:
    """Write the model folder (each file atomically, the manifest last); ``files``: more
    files by name (a private sign sender's kept release); returns the folder."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in (files or {}).items():
        atomic_write(directory / name, data)
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in weights.items()}, buffer)
    atomic_write(directory / WEIGHTS, buffer.getvalue())
    if evaluation is not None:
        nodes, probabilities = evaluation
        out = io.BytesIO()
        np.savez(out, nodes=np.asarray(nodes, np.int64), probabilities=probabilities)
        atomic_write(directory / EVALUATION, out.getvalue())
    full = {
        **ARTEFACT.header(),
        "glasu_version": glasu_version(),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **manifest,
    }
    atomic_write(directory / MANIFEST, (json.dumps(full, indent=2) + "\n").encode())
    return directory


def read_manifest(directory: Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelError(
            f"{directory} is not a glasu model folder (no {MANIFEST}): give the folder of "
            "`glasu train --model-dir` or `glasu worker --model-out`"
        ) from None
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc
    problem = ARTEFACT.problem(manifest, name=str(path))
    if problem is not None:
        written_by = manifest.get("glasu_version") if isinstance(manifest, dict) else None
        hint = f": use the version that wrote it ({written_by})" if written_by else ""
        raise ModelError(f"{problem} (glasu {glasu_version()}){hint}")
    return manifest


def load_model(directory: Path) -> SavedModel:
    manifest = read_manifest(directory)
    path = Path(directory) / WEIGHTS
    try:
        weights = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelError(f"the model {directory} has no {WEIGHTS}") from None
    except Exception as exc:  # the unpickler can raise anything on damaged bytes
        raise ModelError(f"the weights {path} are damaged ({exc})") from exc
    if not isinstance(weights, dict) or not all(
        isinstance(v, torch.Tensor) for v in weights.values()
    ):
        raise ModelError(f"{path} holds something other than tensors")
    release_only = manifest.get("party", {}).get("holds_head") is False
    if manifest.get("model", {}).get("backbone") in PRECOMPUTED_BACKBONES and (
        "scale.factor" not in weights and not (release_only and is_private_sign(manifest))
    ):
        raise ModelError(
            f"the model {directory} was saved before a sign model kept the scale of its "
            "propagated features (it would score with another table's): train it again"
        )
    return SavedModel(manifest=manifest, weights=weights, path=Path(directory))


#: The manifest's ``design`` of a private sign model (models/private_sign.py)
PRIVATE_SIGN = "private-sign"


def is_private_sign(manifest: Mapping[str, Any]) -> bool:
    """A model of the private sign design: scored by post-processing of its kept release."""
    return manifest.get("design") == PRIVATE_SIGN


def class_names(manifest: Mapping[str, Any]) -> list[str] | None:
    """The names of the model's classes, index by index, where its labels table named them
    (``glasu prepare``); None where the classes are numbers (and for a model saved before)."""
    classes = manifest.get("classes") or []
    if classes and all(isinstance(c, str) for c in classes):
        return list(classes)
    return None


def read_evaluation(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(Path(directory) / EVALUATION) as saved:
        return saved["nodes"], saved["probabilities"]


def answer_line(party: Mapping[str, Any]) -> str:
    """Whose prediction is the model's answer (one per customer), for people."""
    answering = party.get("answering_party")
    if answering is None:  # a model of before one answer per customer
        answering = answering_party(party.get("label_holder"))
    if party.get("index") == answering:
        return "its predictions are the model's answer (one per customer)"
    return (
        f"the model's answer is party {answering}'s; this party receives it only where a "
        "scoring session shares it (share_predictions label-holder, agreed by its owner)"
    )


def _alignment(manifest: Mapping[str, Any]) -> str:
    """Which nodes the model was trained on, for people: the parties' own ids aligned privately
    (the alignment's digest, where the run recorded it) or a benchmark's shared ids."""
    digest = manifest.get("alignment_digest")
    if digest:
        return f"the parties' own ids, aligned privately (alignment digest {digest})"
    if manifest.get("features", {}).get("prepared"):  # the party's own `glasu prepare` folder
        return "the parties' own ids, aligned privately in this run (no digest recorded)"
    return "a benchmark dataset's partition (every party has the same node ids: no alignment)"


def describe(manifest: Mapping[str, Any]) -> str:
    """The manifest for people (``glasu model show``)."""
    model = manifest.get("model", {})
    party = manifest.get("party", {})
    best = manifest.get("best", {})
    privacy = manifest.get("privacy")
    lines = [
        f"glasu model, format {manifest.get('format')}, written by glasu "
        f"{manifest.get('glasu_version')} at {manifest.get('created_at')}",
        f"party {party.get('index')} of {party.get('parties')}"
        + (" (holds the classification head)" if party.get("holds_head") else " (release only)")
        + "; labels held by "
        + (
            "every party" if party.get("label_holder") is None else f"party {party['label_holder']}"
        ),
        answer_line(party),
        f"session {manifest.get('session_id')}; {_alignment(manifest)}",
        f"backbone {model.get('backbone')}"
        + (
            f" over {model['hops']} hops, {model.get('feature_scale')} scale"
            if model.get("backbone") in PRECOMPUTED_BACKBONES
            else ""
        )
        + f", {model.get('layers')} layers, hidden "
        f"{model.get('hidden')}, aggregation at layers {model.get('agg_layers')}, "
        f"{model.get('in_features')} features -> {model.get('num_classes')} classes"
        + (f" ({', '.join(named)})" if (named := class_names(manifest)) else "")
        + (", private arrangement (layer-1 release)" if model.get("private") else ""),
        f"features: {len(manifest.get('features', {}).get('names', []))} columns "
        f"({_names(manifest.get('features', {}).get('names', []), most=5)})",
        f"kept: round {best.get('round')} (pass {best.get('pass')}), chosen by "
        f"{best.get('chosen_by')}",
    ]
    if is_private_sign(manifest):
        sign = manifest.get("sign_release", {})
        kept = (
            f"its noisy release ({sign.get('rows')} rows, keyed by {sign.get('rows_keyed_by')})"
            if sign.get("file")
            else "no release (it released nothing)"
        )
        lines.append(f"private sign design: keeps {kept}; scoring is {sign.get('scoring')}")
    for split in ("val", "test"):
        metrics = manifest.get("metrics", {}).get(split)
        if metrics and metrics.get("count"):
            lines.append(f"{split}: {describe_scores(metrics)} ({metrics['count']} nodes)")
    reference = manifest.get("metrics", {}).get("reference_test_accuracy")
    if reference is not None:
        lines.append(f"party alone (same data, no federation): test accuracy {reference:.4f}")
    if privacy:
        lines.append(
            f"privacy spent by the training: epsilon {privacy['epsilon']:.4g} at delta "
            f"{privacy['delta']:g} ({count_releases(privacy['releases'])}, "
            f"{privacy['accountant']}), "
            f"against {privacy['against']}"
        )
    else:
        lines.append("privacy: none (trained without differential privacy)")
    return "\n".join(lines)
