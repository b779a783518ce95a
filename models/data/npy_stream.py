"""A ``.npy`` file written piece by piece, whose length is known only at the end: the header is
written first with room for any row count and rewritten in place when the file is closed. What
is written goes to the file as it comes (not through a memory map: its dirty pages would count in
the writer's memory), so a writer holds one piece at a time."""

from __future__ import annotations

import math
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np

MAGIC = b"\x93NUMPY\x01\x00"  # format version 1.0
HEADER_BYTES = 128  # magic, length and the dict, padded: room for any shape of a few dimensions


class NpyStream:
    """``append`` C-ordered values; ``close`` writes the shape: ``(rows, *row_shape)`` with rows
    the number of whole rows appended (a partial row left over is an error), or the ``rows``
    given, which the values must then fill exactly."""

    def __init__(
        self,
        path: Path,
        dtype: np.dtype | type,
        row_shape: tuple[int, ...],
        *,
        rows: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.row_shape = row_shape
        self.rows = rows
        self.values = 0
        self._file: BinaryIO = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._file.write(b" " * HEADER_BYTES)

    def append(self, values: np.ndarray) -> None:
        block = np.ascontiguousarray(values, dtype=self.dtype)
        self._file.write(memoryview(block).cast("B"))
        self.values += block.size

    def close(self) -> tuple[int, ...]:
        """Finish the file; its shape."""
        row = math.prod(self.row_shape)
        rows = self.rows if self.rows is not None else self.values // max(row, 1)
        if self.values != rows * row:
            raise ValueError(f"{self.path}: {self.values} values are not {rows} rows of {row}")
        shape = (rows, *self.row_shape)
        self._file.seek(0)
        self._file.write(header(self.dtype, shape))
        self._file.close()
        return shape

    def __enter__(self) -> NpyStream:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
        else:
            self._file.close()


def header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The .npy header of a C-ordered array, padded to :data:`HEADER_BYTES`."""
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    text = repr(fields).encode("latin1")
    room = HEADER_BYTES - len(MAGIC) - 2 - 1  # the 2-byte length and the closing newline
    if len(text) > room:
        raise ValueError(f"a .npy header for shape {shape} does not fit in {HEADER_BYTES} bytes")
    text = text.ljust(room) + b"\n"
    return MAGIC + len(text).to_bytes(2, "little") + text
