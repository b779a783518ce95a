"""The N-row arrays of an evaluation pass (``models.layerwise``): on the CPU, those of more than
``SPILL_BYTES`` live in an unlinked temporary file mapped into memory, so what a pass holds in
anonymous memory is bounded by its chunk, not by the number of nodes.

A pass over N nodes keeps a few N x width float32 arrays per network (the input projection, the
layer below, the layer being computed, the others' part of a sum): 3.9 KB per node at width 128
for a private client and its party-alone reference, 39 GB at 10M nodes. Mapped from a file,
their pages are page cache that the kernel writes back and drops under memory pressure, instead
of anonymous memory that only swap could take. Every array is read chunk by chunk or gathered by
a chunk's sources, so a pass touches them in an order the page cache handles.

The file is created in ``tempfile.gettempdir()`` (``TMPDIR``; docs/deploy.md: put it on a disk,
not a tmpfs, whose pages are memory again) and unlinked at once, so nothing is left behind by a
worker that dies. On a GPU the arrays are device memory (about 40 GB at 10M nodes and width 128
for a private client's pass).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import numpy as np
import torch

#: Arrays of more bytes than this are mapped from a temporary file on the CPU (64 MiB: 131,072
#: rows at width 128); smaller ones stay in memory, where a file buys nothing.
SPILL_BYTES = 64 << 20


def node_array(rows: int, cols: int, *, device: torch.device) -> torch.Tensor:
    """An uninitialised ``rows`` x ``cols`` float32 tensor on ``device``; on the CPU, above
    :data:`SPILL_BYTES`, backed by an unlinked temporary file (see the module docstring)."""
    nbytes = rows * cols * 4
    if device.type != "cpu" or nbytes <= SPILL_BYTES:
        return torch.empty(rows, cols, device=device)
    with tempfile.TemporaryFile(prefix="glasu-pass-") as backing:
        backing.truncate(nbytes)
        # the mapping outlives the file object: it is released with the last tensor viewing it
        mapped = np.memmap(backing, dtype=np.float32, mode="r+", shape=(rows, cols))
    return torch.from_numpy(mapped)


def chunk_rows(rows: int, *, chunk: int) -> Iterator[slice]:
    """Consecutive slices of at most ``chunk`` rows covering ``rows``."""
    for start in range(0, rows, chunk):
        yield slice(start, min(start + chunk, rows))


def host_rows(tensor: torch.Tensor, *, chunk: int) -> np.ndarray:
    """``tensor`` (2-D) as a float32 numpy array on the host: a view of a CPU tensor, else
    copied ``chunk`` rows at a time into a :func:`node_array` (no whole host copy in memory)."""
    if tensor.device.type == "cpu":
        return tensor.detach().numpy().astype(np.float32, copy=False)
    host = node_array(*tensor.shape, device=torch.device("cpu")).numpy()
    for rows in chunk_rows(len(tensor), chunk=chunk):
        host[rows] = tensor[rows].detach().cpu().numpy()
    return host
