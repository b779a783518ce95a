"""Every setting of a training run, torch-free so that a command line can read the defaults
without loading torch."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from secure.accounting import AccountantName
from secure.dp import DEFAULT_DEGREE_FLOOR, ReleaseKind
from secure.privacy import SessionPrivacy, release_fields
from secure.protocol import AlignedNodes, SecureAggregation, ShareEncoding, StragglerPolicy

SplitName = Literal["paper", "public", "aligned"]  # aligned: glasu train --party
BackboneName = Literal["gcnii", "gcn", "gat", "sign"]
#: Backbones whose propagation is precomputed before training (models/data/propagation.py): their
#: passes sample no neighbour, and their input reaches K hops, which the private arrangement's
#: sensitivity bound does not cover (docs/privacy.md)
PRECOMPUTED_BACKBONES: frozenset[str] = frozenset({"sign"})
#: The private sign design's one release (models/private_sign.py, docs/privacy.md 3.8): its
#: occurrence cap c and degree floor d_min, fixed before any data is seen. d_min = c + 1: a node
#: drawn c times and its own row fill d_min rows, so Delta = 2C / sqrt(c + 1) wherever a
#: target's drawn neighbourhood is full; c = 7 fills it at degree 7 and above.
SIGN_OCCURRENCE_CAP, SIGN_DEGREE_FLOOR = 7, 8
#: Hops of the precomputed propagation (``--hops``): SGC's K, as the SGC party-alone reference
DEFAULT_HOPS = 3
#: How a precomputed backbone scales its propagated columns (models/data/propagation.py)
ScaleName = Literal["column", "hop"]
FeatureScaleName = Literal["auto", "column", "hop"]  # auto: from the party's own table
Mode = Literal["glasu", "centralized", "standalone", "simulated"]
Encryption = Literal["ckks", "none"]
DEVICE_NAMES = re.compile(r"auto|cpu|cuda(:\d+)?")  # --device; models/device.py resolves it


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run (the report's ``config``)."""

    dataset: str = "cora"
    data_dir: Path | None = None
    split: SplitName = "paper"
    # --party: train on the nodes every party holds, or on the union (partly shared nodes, the
    # count-aware mean)
    nodes: AlignedNodes = "intersection"
    mode: Mode = "glasu"
    clients: int = 3
    backbone: BackboneName = "gcnii"
    hops: int = DEFAULT_HOPS  # K of the sign backbone's propagation (other backbones: unused)
    feature_scale: FeatureScaleName = "auto"  # of the sign backbone's propagated columns
    layers: int = 4
    agg_layers: int = 2  # K
    stale: int = 4  # Q
    # GLASU Appendix B.2: only client m holds the labels and the split (None: every client)
    label_holder: int | None = None
    # through the service: a late client is waited for, or a pass goes on without it after
    # straggler_wait_seconds (docs/protocol.md)
    stragglers: StragglerPolicy = "wait"
    straggler_wait_seconds: float = 60.0
    cache_rounds: int = 1  # W: rounds of stale statistics local steps reuse (CELU-VFL)
    instance_weighting: bool = False  # CELU-VFL's staleness weights in local steps
    weight_threshold: float = 0.5  # cos(xi) of the instance weights
    rounds: int = 300
    batch_size: int = 16
    fanout: int = 3
    eval_fanout: int = 10
    # Every evaluation pass is a joint inference over the validation and test nodes (most of
    # the graph: ~20 training passes' worth of encrypted floats on Cora) and, with DP, one
    # release: every 20 rounds halves that against every 10 (docs/encryption.md).
    eval_every: int = 20
    hidden: int = 128
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 5e-4
    edge_fraction: float = 0.8
    seed: int = 0
    device: str = "auto"
    # Encryption and differential privacy: on unless switched off.
    encryption: Encryption = "ckks"
    # "masks": pairwise-masked shares under BFV (docs/secure-aggregation.md)
    secure_aggregation: SecureAggregation = "none"
    dp: bool = True
    epsilon: float | None = 4.0  # target; calibrates z when noise_multiplier is None
    delta: float = 1e-6
    noise_multiplier: float | None = None
    clip: float = 1.0
    accountant: AccountantName = "rdp"
    release_width: int = 16
    occurrence_cap: int = 1
    shared_noise: bool = False  # opt-in, with encryption only: weaker adversary (one curious peer)
    # split discrete Gaussian noise, M >= 3 (docs/privacy.md section 11). None: on under masked
    # secure aggregation with 3 clients or more, unshared noise asked for and stragglers
    # "wait", off otherwise (False keeps the unshared noise under masks: --no-split-noise)
    split_noise: bool | None = None
    # how the layer-1 release is formed (docs/privacy.md 3.7): clipped after the aggregation,
    # or each node's own row clipped, then a mean with a degree floor d_min
    release: ReleaseKind = "clip-after"
    degree_floor: int = DEFAULT_DEGREE_FLOOR
    # the private sign design's one release (models/private_sign.py): occurrence cap, floor
    sign_occurrence_cap: int = SIGN_OCCURRENCE_CAP
    sign_degree_floor: int = SIGN_DEGREE_FLOOR
    noise_seed: int | None = None  # reproducible noise, for experiments only

    @property
    def releases_anything(self) -> bool:
        """Centralized and standalone training send nothing to anyone."""
        return self.mode in ("glasu", "simulated")

    @property
    def encrypted(self) -> bool:
        return self.encryption == "ckks" and self.releases_anything

    @property
    def masked(self) -> bool:
        return self.secure_aggregation == "masks" and self.encrypted

    @property
    def encoding(self) -> ShareEncoding:
        """How the run's shares travel."""
        if self.masked:
            return "bfv-masked"
        return "ckks" if self.encrypted else "float32"

    @property
    def private(self) -> bool:
        return self.dp and self.releases_anything

    @property
    def splits_noise(self) -> bool:
        """Whether the run's noise is split (``split_noise``, its default resolved)."""
        if self.split_noise is not None:
            return self.split_noise
        return (
            self.masked
            and self.private
            and self.clients >= 3
            and not self.shared_noise
            and self.stragglers == "wait"
        )

    def privacy_request(self) -> dict[str, Any] | None:
        """The privacy the run asks for: the ``privacy`` object of ``POST /v1/sessions`` (z is
        None unless given: whoever plans the session calibrates it), or None without DP."""
        if not self.private:
            return None
        return (
            {
                "epsilon": self.epsilon,
                "delta": self.delta,
                "noise_multiplier": self.noise_multiplier,
                "clip": self.clip,
                "occurrence_cap": self.occurrence_cap,
                "accountant": self.accountant,
                "shared_noise": self.shared_noise and self.encrypted,
            }
            | ({"split_noise": True} if self.splits_noise else {})
            | release_fields(self.release, self.degree_floor)
        )

    def session_privacy(self, *, clients: int, passes_total: int) -> SessionPrivacy | None:
        """The run's privacy plan (``secure.privacy``), as the service would plan it."""
        request = self.privacy_request()
        if request is None:
            return None
        return SessionPrivacy.plan(
            **request,
            clients=clients,
            passes_total=passes_total,
            encrypted=self.encrypted,
            masked=self.masked,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()
        }


def backbone_problem(backbone: str, *, private: bool, one_release: bool = False) -> str | None:
    """Why ``backbone`` cannot train a run with (``private``) or without differential privacy,
    or None. Under DP a precomputed backbone trains the private sign design
    (models/private_sign.py: one release per party, then local training), in process or over
    the service in a session planned as that one release (``one_release``: kind "release"); a
    private session of passes (kind "training") refuses it."""
    if private and backbone in PRECOMPUTED_BACKBONES and not one_release:
        return (
            f"the {backbone} backbone under differential privacy (one degree-normalised release "
            "per party, docs/privacy.md 3.8) needs a session planned as that one release (kind "
            "'release', which glasu train creates), not a session of training passes: use "
            "--no-dp, or another backbone"
        )
    return None
