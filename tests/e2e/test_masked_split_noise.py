"""A masked run with DP over real HTTP (docs/privacy.md section 11.6): the session splits the
noise by default, every worker's policy admits it, the run summary holds the target against
one peer with the per-adversary lines, and each organisation's compliance report says its shares
were masked, with the line of the service with one peer."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.local.federation import train_over_http
from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger
from clients.policy import PrivacyPolicy
from clients.privacy_report import organisation_content
from models.config import TrainConfig
from models.layout import layout_federation
from secure.report import SHARES

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_masked_run_with_dp_over_http_splits_the_noise(cora, tmp_path: Path) -> None:
    config = TrainConfig(
        clients=3, rounds=1, eval_every=0, hidden=16, batch_size=8, eval_fanout=3, seed=2,
        device="cpu", secure_aggregation="masks", epsilon=4.0,
    )  # fmt: skip
    summary = train_over_http(
        config, layout_federation(config, cora), cora, progress=False, work_dir=tmp_path
    )
    report = summary.privacy
    assert report is not None and report["split_noise"] is True
    against = {a["key"]: a["epsilon"] for a in report["split"]["adversaries"]}
    assert against["peer"] == pytest.approx(4.0, rel=1e-3)
    assert against["service_peer"] == against["peer"] < against["colluding"]
    assert any("colluding peer" in line for line in report["adversary_lines"])
    ledgers = sorted(tmp_path.rglob(LEDGER_FILENAME))
    assert len(ledgers) == 3
    for path in ledgers:
        with OwnerLedger(path) as ledger:
            snapshot = ledger.snapshot()
        content = organisation_content([snapshot], policy=PrivacyPolicy(), generated_at=0.0)
        [session] = content["sessions"]
        assert session["shares"] == SHARES["bfv-masked"]
        lines = {a["key"]: a["epsilon"] for a in session["adversaries"]}
        assert lines["service_peer"] == pytest.approx(lines["peer"])
        assert lines["peer"] < lines["colluding"]
