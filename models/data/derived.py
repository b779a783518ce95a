"""What a client derives from its partition's data alone, kept while that data is loaded: its
sampling graph (``models.sampler.SamplingGraph``, a sort of every edge) and a precomputed
backbone's propagated features (``models.data.propagation.propagate_hops``, ``hops`` sparse
products over all nodes) and their scaling statistics, and a private sign sender's block of its
kept release over the current graph (``models.private_sign_kept.kept_block``).

A client is built per session, and an online scoring worker builds one per request
(``clients/cli/worker_online.py``) on the partition it loaded once: deriving these again would
cost O(edges) per request, however few nodes it asks for. They depend on the edge and feature
tensors only, which a partition keeps across ``dataclasses.replace`` (a passive party's copy
without labels shares them), so they are kept per pair of tensor objects and dropped with the
edge tensor.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import numpy as np
    import torch

    from models.config import FeatureScaleName, ScaleName
    from models.data.partition import ClientPartition
    from models.data.propagation import HopFeatures
    from models.private_sign_kept import KeptRelease
    from models.sampler import SamplingGraph

T = TypeVar("T")

_lock = threading.Lock()
# id(edge tensor) -> {what: derived}; an entry goes when its edge tensor is collected
_derived: dict[int, dict[tuple[Any, ...], Any]] = {}


def _kept(partition: ClientPartition, what: tuple[Any, ...], derive: Callable[[], T]) -> T:
    """``derive()`` once per edge tensor of ``partition`` and ``what`` (which names the feature
    tensor where the derivation reads it)."""
    edges = partition.edge_index
    key = id(edges)
    with _lock:
        found = _derived.get(key, {}).get(what)
    if found is not None:
        return found
    value = derive()  # outside the lock: clients built in parallel threads derive their own
    with _lock:
        if key not in _derived:
            _derived[key] = {}
            weakref.finalize(edges, _derived.pop, key, None)
        return _derived[key].setdefault(what, value)


def sampling_graph(partition: ClientPartition) -> SamplingGraph:
    """The partition's graph as the samplers read it, built once."""
    from models.sampler import SamplingGraph

    return _kept(
        partition,
        ("graph",),
        lambda: SamplingGraph.from_edge_index(partition.edge_index, num_nodes=partition.num_nodes),
    )


def hop_features(partition: ClientPartition, *, hops: int) -> HopFeatures:
    """The partition's features and their ``hops`` propagations, computed once."""
    from models.data.propagation import propagate_hops

    return _kept(
        partition,
        ("hops", id(partition.features), hops),
        lambda: propagate_hops(partition, hops=hops),
    )


def hop_scaling(
    partition: ClientPartition, *, hops: int, feature_scale: FeatureScaleName
) -> tuple[ScaleName, tuple[torch.Tensor, torch.Tensor]]:
    """How the propagated columns are scaled (``feature_scale``, ``auto`` decided from the
    party's table) and the party's statistics for it, computed once."""
    from models.data.propagation import chosen_scale, scale_statistics

    def derive() -> tuple[ScaleName, tuple[torch.Tensor, torch.Tensor]]:
        scale = chosen_scale(partition, feature_scale)
        features = hop_features(partition, hops=hops)
        return scale, scale_statistics(features, partition.held, scale=scale)

    return _kept(partition, ("scaling", id(partition.features), hops, feature_scale), derive)


def kept_release_block(
    partition: ClientPartition,
    kept: KeptRelease,
    own_ids: np.ndarray,
    *,
    release: str,
    keys: Hashable,
    hops: int,
) -> HopFeatures:
    """A private sign sender's block over the partition's current nodes from its ``kept``
    release (its rows put in the current order by ``own_ids``, each current node's key),
    computed once per kept release (``release``: its digest), hops and ``keys`` (what names
    ``own_ids``: where the worker read them, loaded with the partition)."""
    from models.private_sign_kept import kept_block

    def derive() -> HopFeatures:
        rows, covered = kept.in_current_order(own_ids)
        return kept_block(rows, covered, partition, hops=hops)

    return _kept(partition, ("kept-block", release, hops, keys), derive)
