"""Class names: a label table whose class column holds names (``fraud``, ``paid``) rather than
class indices. ``glasu prepare`` numbers the names in sorted order (every party that labels
with the same names numbers its classes the same) and keeps them in the folder's meta.json
(``class_names``); the trained model's manifest and the predictions carry them on."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from models.data.table_file import TableError

#: The key of meta.json that holds the names, index by index.
CLASS_NAMES = "class_names"
INTEGER_TEXT = r"^[+-]?[0-9]+$"


def holds_names(values: pa.Array) -> bool:
    """A text label column none of whose values is a number: class names, not indices (a
    number among them makes it a column of indices, whose other values are then refused)."""
    if not len(values) or not (
        pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
    ):
        return False
    return not bool(pc.any(pc.match_substring_regex(values, INTEGER_TEXT)).as_py())


class ClassNames:
    """The names of a label column as they are read, each with a code (first seen), numbered
    at the end in sorted order."""

    def __init__(self) -> None:
        self.code_of: dict[str, int] = {}

    def codes(self, path: Path, values: pa.Array, column: str, first_row: int) -> np.ndarray:
        """The code of each name in a batch of the label column (no missing value)."""
        numbers = pc.match_substring_regex(pc.cast(values, pa.string()), INTEGER_TEXT)
        if pc.any(numbers).as_py():
            row = int(np.flatnonzero(numbers.to_numpy(zero_copy_only=False))[0])
            raise TableError(
                path,
                f"{values[row].as_py()!r} is a class index among class names: label with "
                "names or with indices, not both",
                row=first_row + row,
                column=column,
            )
        for value in pc.unique(values).to_pylist():
            self.code_of.setdefault(value, len(self.code_of))
        codes = pc.index_in(values, value_set=pa.array(list(self.code_of), pa.string()))
        return codes.to_numpy(zero_copy_only=False).astype(np.int64)

    def sorted(self) -> list[str]:
        return sorted(self.code_of)

    def numbered(self, labels: np.ndarray, *, unlabelled: int) -> np.ndarray:
        """``labels`` (codes, ``unlabelled`` where none) as class indices: the names' sorted
        order."""
        index_of_code = np.empty(len(self.code_of), dtype=np.int64)
        for index, value in enumerate(self.sorted()):
            index_of_code[self.code_of[value]] = index
        labelled = labels != unlabelled
        labels[labelled] = index_of_code[labels[labelled]]
        return labels


def class_names_in(meta: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The class names a prepared folder's meta.json (or a model's manifest) holds, if any."""
    names = meta.get(CLASS_NAMES)
    return None if names is None else tuple(str(name) for name in names)
