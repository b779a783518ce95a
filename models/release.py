"""How a client's share of an aggregation layer leaves it: the release policy.

The joint aggregation (``models/joint.py``) hands a policy the whole clean share of a layer
with its :class:`ReleaseScope` (the pass, the layer, the node ids of its rows, how it is cut in
parts) and sends what the :class:`Release` it gets back makes of each part. A policy is one
class: :class:`PlainRelease` sends the share as it is; :class:`DpRelease` clips and noises it,
the differential-privacy release of the private arrangement (``models/private.py``), every part
carrying the digest of the whole release. Another way of sending shares (masked shares of secure
aggregation) is another subclass of :class:`ReleasePolicy`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from secure.dp import privatize
from secure.noise import NoiseSource
from secure.protocol import MIN_CONTRIBUTORS
from secure.release_noise import ReleaseMechanism, part_key, release_digest, split_share_part


@dataclass(frozen=True)
class PassContext:
    """The pass a client runs, handed down to everything that computes or sends a part of it
    (rather than read from attributes set elsewhere)."""

    pass_index: int
    kind: str  # "train" or "eval"
    output_nodes: np.ndarray  # sorted node ids


@dataclass(frozen=True)
class ReleaseScope:
    """What one release is of: a pass's share of wire layer ``layer``, its rows the nodes
    ``rows``, sent in parts of ``part_rows`` rows with a count-aware session's ``presence``
    column."""

    context: PassContext
    layer: int
    rows: np.ndarray
    part_rows: int
    presence: np.ndarray | None


class Release(ABC):
    """One share as it is released, part by part."""

    #: The digest every part carries (``secure.protocol.ShareRequest.release``), or None.
    digest: str | None = None

    @abstractmethod
    def part(self, index: int, clean: np.ndarray) -> np.ndarray:
        """Part ``index`` of the share as it is sent, from its clean rows."""


class ReleasePolicy(ABC):
    """How every share of a client is released."""

    @abstractmethod
    def begin(self, scope: ReleaseScope, clean: np.ndarray) -> Release:
        """The release of the whole clean share ``clean`` of ``scope``, before its first part
        is sent."""

    def fewest_shares(self, clients: int) -> int:
        """The fewest shares a sum may hold: ``MIN_CONTRIBUTORS`` (a pass that went on without
        a straggler)."""
        return min(MIN_CONTRIBUTORS, clients)

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the policy (in the client's ``state_dict``)."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put back what :meth:`state_dict` kept."""


class _AsItIs(Release):
    def part(self, index: int, clean: np.ndarray) -> np.ndarray:
        return clean


class PlainRelease(ReleasePolicy):
    """Shares sent as they are computed (GLASU without differential privacy)."""

    def begin(self, scope: ReleaseScope, clean: np.ndarray) -> Release:
        return _AsItIs()

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the release is the share."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to put back."""


@dataclass(frozen=True)
class ReleaseSettings:
    """The release everyone agreed on (session) and this client's noise."""

    width: int  # columns of the release
    clip: float  # C
    noise_std: float  # this client's standard deviation per coordinate
    noise: NoiseSource
    projection_seed: int  # public: the same for both runs of a neighbouring-dataset pair
    mechanism: ReleaseMechanism  # every parameter of the noise: part of each release's identity


class _Privatized(Release):
    def __init__(self, settings: ReleaseSettings, key: bytes) -> None:
        self.settings = settings
        self.key = key
        self.digest = key.hex()

    def part(self, index: int, clean: np.ndarray) -> np.ndarray:
        """Clip and noise part ``index``, its noise keyed by the release's digest and the part
        (``secure.release_noise.part_key``): a function of the release, so a release computed
        again sends the identical parts."""
        settings = self.settings
        if settings.mechanism.split_noise:
            # clip, round to the grid, add the party's discrete Gaussian: no clamp after
            return split_share_part(
                clean, clip=settings.clip, noise_std=settings.noise_std, noise=settings.noise,
                release=self.key, part=index,
            )  # fmt: skip
        return privatize(
            clean,
            clip=settings.clip,
            noise_std=settings.noise_std,
            noise=settings.noise.for_release(part_key(self.key, index)),
        )


class DpRelease(ReleasePolicy):
    """The differentially private release: every row clipped to norm C and noised; the digest
    of the whole clean release and of its mechanism (what the noise of a release-keyed source is
    derived from, and what the owner's gate records) goes with every part."""

    def __init__(self, settings: ReleaseSettings) -> None:
        self.settings = settings

    def begin(self, scope: ReleaseScope, clean: np.ndarray) -> Release:
        key = release_digest(
            pass_index=scope.context.pass_index,
            layer=scope.layer,
            output_nodes=scope.context.output_nodes,
            rows=scope.rows,
            clean=clean,
            mechanism=self.settings.mechanism,
            part_rows=scope.part_rows,
            presence=scope.presence,
        )
        return _Privatized(self.settings, key)

    def fewest_shares(self, clients: int) -> int:
        """With shared noise every client adds 1/M of the variance, with split noise
        1/(M - 1) of it, so a sum of fewer than M shares carries less noise than accounted: only
        a sum of all M is taken."""
        mechanism = self.settings.mechanism
        if mechanism.shared_noise or mechanism.split_noise:
            return clients
        return super().fewest_shares(clients)

    def state_dict(self) -> dict[str, Any]:
        """The state of the release's noise (``secure.noise.NoiseSource.state_dict``: nothing
        for release-keyed noise, the generator of seeded test noise)."""
        return {"noise": self.settings.noise.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """``secure.noise.NoiseStateError`` for another noise."""
        self.settings.noise.load_state_dict(state["noise"])
