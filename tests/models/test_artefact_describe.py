"""`glasu model show` in words (models/artefact.py ``describe``): which nodes a model was
trained on, and its privacy spend with the plural right."""

from __future__ import annotations

from typing import Any

import pytest

from models.artefact import describe

PREPARED = {"names": ["income"], "prepared": {"nodes": "bank.csv", "id_column": "customer"}}
BENCHMARK = {"names": ["cora feature 0"], "prepared": {}}


@pytest.mark.parametrize(
    ("alignment_digest", "features", "says"),
    [
        ("ab12", PREPARED, "the parties' own ids, aligned privately (alignment digest ab12)"),
        (None, PREPARED, "the parties' own ids, aligned privately in this run (no digest"),
        (None, BENCHMARK, "a benchmark dataset's partition (every party has the same node ids"),
    ],
)
def test_the_manifest_says_which_nodes_the_model_was_trained_on(
    alignment_digest: str | None, features: dict[str, Any], says: str
) -> None:
    text = describe({"session_id": "s1", "alignment_digest": alignment_digest,
                     "features": features})  # fmt: skip
    assert f"session s1; {says}" in text
    assert "benchmark partition)" not in text or features is BENCHMARK


def test_one_release_is_one_release() -> None:
    privacy = {"epsilon": 0.5, "delta": 1e-5, "accountant": "rdp", "against": "any one partner"}
    one = describe({"features": BENCHMARK, "privacy": {**privacy, "releases": 1}})
    assert "(1 release, rdp)" in one
    assert "(3 releases, rdp)" in describe({"features": BENCHMARK,
                                            "privacy": {**privacy, "releases": 3}})  # fmt: skip
