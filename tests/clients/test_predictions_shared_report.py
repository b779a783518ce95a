"""The answers an organisation sent its partners (``predictions_shared``, counted in its ledger
by a scoring session that shares the answer) in what its owner reads: ``glasu budget --local``
(text and JSON) and the compliance report (clients/privacy_report.py, secure/report_html.py),
per session and in total; a ledger without shared answers keeps its digest. No service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.cli.main import main
from clients.owner_ledger import OwnerLedger
from clients.policy import PrivacyPolicy
from clients.privacy_report import organisation_content
from secure.report_html import render_html

OPEN = PrivacyPolicy(max_session_epsilon=100.0, max_lifetime_epsilon=100.0)


def _ledger(data: Path, *, shared: int) -> OwnerLedger:
    ledger = OwnerLedger.beside(data)
    for session_id in ("training", "scoring"):
        ledger.record(session_id=session_id, pass_index=0, noise_multiplier=5.0, kind="scoring")
    if shared:
        ledger.note_predictions_shared("scoring", shared)
    return ledger


def test_budget_shows_the_predictions_shared_per_session_and_in_total(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _ledger(tmp_path, shared=37).close()
    assert main(["budget", "--local", str(tmp_path), "--json"]) == 0
    budget = json.loads(capsys.readouterr().out)
    assert budget["predictions_shared"] == 37
    by_session = {row["session"]: row["predictions_shared"] for row in budget["sessions"]}
    assert by_session == {"training": 0, "scoring": 37}
    assert main(["budget", "--local", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "37 prediction(s) shared with the partners" in text
    assert "  scoring: 1 release(s)" in text and text.count("prediction(s) shared") == 2


def test_the_compliance_report_shows_the_predictions_shared(tmp_path: Path) -> None:
    with _ledger(tmp_path / "shared", shared=37) as ledger:
        content = organisation_content([ledger.snapshot()], policy=OPEN, generated_at=0.0)
    assert content["total"]["predictions_shared"] == 37
    assert [s["predictions_shared"] for s in content["sessions"]] == [0, 37]
    page = render_html(content)
    assert "<b>Predictions shared:</b> 37 of this organisation" in page
    assert "1 scoring; 37 prediction(s) shared with the partners</td>" in page
    with _ledger(tmp_path / "none", shared=0) as ledger:
        content = organisation_content([ledger.snapshot()], policy=OPEN, generated_at=0.0)
        assert "predictions_shared" not in ledger.snapshot().sessions.get("scoring", {})
    assert content["total"]["predictions_shared"] == 0
    assert "Predictions shared" not in render_html(content)
