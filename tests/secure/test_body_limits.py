"""Parts sized to a body limit (secure/body_limits.py): what the sizing promises holds for real
encodings, and a limit too small for one row says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from secure.body_limits import (
    BodyLimitTooSmall,
    set_part_elements,
    share_part_bytes,
    share_part_values,
)
from secure.ckks import CkksCodec, generate_keys
from secure.ckks_context import VALUES_PER_CIPHERTEXT
from secure.protocol import PART_VALUES, part_rows

PROXY_DEFAULT = 2**20  # nginx's client_max_body_size


@pytest.mark.parametrize("cols", [16, 129])
def test_a_ckks_part_sized_to_one_mib_fits_it_encrypted(tmp_path: Path, cols: int) -> None:
    """A real CKKS share of a whole part, of values as large as a share may hold, is smaller
    than the bound the part was sized by, which is under the limit."""
    codec = CkksCodec.from_file(generate_keys(tmp_path)[0])
    part_values = share_part_values(PROXY_DEFAULT, encoding="ckks", widest=cols)
    assert part_values % VALUES_PER_CIPHERTEXT == 0 and part_values < PART_VALUES
    rows = part_rows(cols, part_values)
    bound = codec.value_bound(shares=3)
    share = np.random.default_rng(cols).uniform(-bound, bound, size=(rows, cols))
    encoded = codec.encode(share)
    assert len(encoded) <= share_part_bytes(part_values, encoding="ckks") <= PROXY_DEFAULT
    assert len(encoded) > PROXY_DEFAULT * 0.6  # and the limit is used, not wasted


def test_float32_parts_and_set_parts_fill_the_limit_less_its_headroom() -> None:
    assert share_part_values(PROXY_DEFAULT, encoding="float32", widest=64) * 4 <= PROXY_DEFAULT
    assert share_part_values(64 * PROXY_DEFAULT, encoding="float32", widest=64) == PART_VALUES
    assert set_part_elements(PROXY_DEFAULT) * 32 <= PROXY_DEFAULT
    assert set_part_elements(PROXY_DEFAULT) > 32_000


def test_a_limit_too_small_for_one_row_is_refused_naming_the_setting() -> None:
    with pytest.raises(BodyLimitTooSmall, match=r"cannot carry one row.*GLASU_MAX_BODY_BYTES"):
        share_part_values(32 * 1024, encoding="ckks", widest=16)  # one ciphertext is ~33 KiB
    with pytest.raises(BodyLimitTooSmall, match="cannot carry one row"):
        share_part_values(4096, encoding="float32", widest=1024)
    with pytest.raises(BodyLimitTooSmall, match="one 32-byte set element"):
        set_part_elements(32)
