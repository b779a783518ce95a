"""The privacy report a compliance officer reads: two private sessions run against the real
service app in process, each worker on a persistent data folder (its ledger stays), then
``glasu report`` of one organisation's ledger, checked against ``glasu budget --local --json``,
signed and verified; the operator's page of the same session; both shown in a real browser."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import sqlite3
import subprocess
import threading
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from clients.cli.main import main
from clients.local.asgi import InProcessTransport
from clients.local.session import session_request
from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger
from clients.policy import PrivacyPolicy
from clients.service_http import ConnectionOptions
from clients.session_client import SessionClient
from clients.session_fit import LocalModelOptions
from clients.worker import WorkerRun
from models.config import TrainConfig
from models.layout import layout_federation
from secure.accounting import composed_epsilon
from secure.aggregation import PlainCodec
from service.app import create_app
from service.settings import ServiceSettings

CONFIG = TrainConfig(
    rounds=3, eval_every=0, hidden=32, dp=True, epsilon=8.0, seed=5, device="cpu", encryption="none"
)  # passes: train 0, train 1, train 2, eval 3
POLICY = PrivacyPolicy(max_session_epsilon=100.0, max_lifetime_epsilon=100.0)
PARTNERS = ["Bank A", "Telco B", "Retailer C"]
OPERATOR = "Consortium Ops"
LABELS = ["churn model, first try", "churn model, second try"]


@dataclass
class Federation:
    root: Path
    app: Any
    transport: InProcessTransport
    admin_token: str
    sessions: list[dict[str, Any]]

    def get(self, path: str, token: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with httpx.Client(base_url="http://glasu.test", transport=self.transport) as client:
            return client.get(path, headers=headers)

    def data(self, m: int) -> Path:
        return self.root / f"org-{m}"


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory, cora) -> Any:
    root = tmp_path_factory.mktemp("report")
    token = secrets.token_urlsafe(24)
    app = create_app(ServiceSettings(database=root / "service.sqlite3", admin_token=token))
    transport = InProcessTransport(app)
    layout = layout_federation(CONFIG, cora)
    admin = SessionClient(
        base_url="http://glasu.test", session_id="", client_index=0, token=token,
        options=ConnectionOptions(transport=transport),
    )  # fmt: skip
    sessions = []
    for label in LABELS:
        body = {
            **session_request(CONFIG, layout, cora),
            "label": label,
            "partners": PARTNERS,
            "operator": OPERATOR,
        }
        session = admin._request("POST", "/v1/sessions", json=body).json()
        sessions.append(session)
        errors: list[BaseException] = []

        def work(
            m: int, session: dict[str, Any] = session, errors: list[BaseException] = errors
        ) -> None:
            torch.set_num_threads(1)
            try:
                with (
                    SessionClient(
                        base_url="http://glasu.test",
                        session_id=session["session_id"],
                        client_index=m,
                        token=session["client_tokens"][m],
                        options=ConnectionOptions(transport=transport, poll_seconds=5),
                    ) as connection,  # fmt: skip
                    OwnerLedger.beside(root / f"org-{m}") as ledger,
                ):
                    WorkerRun(
                        connection,
                        layout.partitions[m],
                        options=LocalModelOptions(hidden=CONFIG.hidden, seed=CONFIG.seed),
                        codec=PlainCodec(),
                        policy=POLICY,
                        ledger=ledger,
                    ).run()
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(m,)) for m in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        if errors:
            raise errors[0]
    admin.close()
    yield Federation(root, app, transport, token, sessions)
    transport.shutdown()


def _cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def report_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("key")
    assert main(["report", "keygen", "--out", str(out)]) == 0
    return out


def _report(
    federation: Federation, report_key: Path, out: Path, capsys: pytest.CaptureFixture
) -> str:
    code, text = _cli(
        capsys, "report", "--local", str(federation.data(0)), "--out", str(out),
        "--signing-key", str(report_key / "report-signing.key"),
        "--max-session-epsilon", "10", "--max-lifetime-epsilon", "20",
    )  # fmt: skip
    assert code == 0, text
    return out.read_text(encoding="utf-8")


def test_the_ledger_keeps_who_and_what_for(federation: Federation) -> None:
    with OwnerLedger.beside(federation.data(0)) as ledger:
        snapshot = ledger.snapshot()
    ids = [s["session_id"] for s in federation.sessions]
    assert list(snapshot.sessions) == ids
    for sid, label in zip(ids, LABELS, strict=True):
        record = snapshot.sessions[sid]
        assert record["label"] == label and record["partners"] == PARTNERS
        assert record["operator"] == OPERATOR and record["kind"] == "training"
        assert record["test_accuracy"] is not None
        assert record["reference_test_accuracy"] is not None
        kinds = [r["kind"] for r in snapshot.releases if r["session_id"] == sid]
        assert kinds == ["training", "training", "training", "evaluation"]
    assert "secret" not in json.dumps(snapshot.releases) + json.dumps(snapshot.sessions)


def test_the_report_answers_the_officer_and_matches_glasu_budget(
    federation: Federation, report_key: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _report(federation, report_key, tmp_path / "report.json", capsys)
    document = json.loads((tmp_path / "report.json").read_text())
    report = document["report"]
    code, text = _cli(capsys, "budget", "--local", str(federation.data(0)), "--json")
    assert code == 0
    budget = json.loads(text)
    assert report["total"]["releases"] == budget["releases"] == 8
    assert report["total"]["epsilon"] == pytest.approx(budget["epsilon"], rel=1e-12)
    for ours, theirs in zip(report["sessions"], budget["sessions"], strict=True):
        assert ours["session_id"] == theirs["session"]
        assert ours["label"] == theirs["label"]
        assert ours["epsilon"] == pytest.approx(theirs["epsilon"], rel=1e-12)
        assert ours["releases"] == theirs["releases"] == 4
        assert ours["by_kind"] == {"training": 3, "evaluation": 1}
        assert ours["partners"] == PARTNERS and ours["operator"] == OPERATOR
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ours["first_release_at"])
        assert ours["accuracy"]["federated"] is not None
        keys = [a["key"] for a in ours["adversaries"]]
        assert keys == ["service", "peer", "colluding", "group"]
        group = ours["adversaries"][-1]
        assert group["epsilon"] > ours["epsilon"]  # the larger unit: more than the target's
    spent = report["total"]["epsilon"]
    assert report["caps"][0] == {
        "name": "lifetime cap", "limit": 20.0, "spent": spent, "left": 20.0 - spent,
        "sentence": f"Spent epsilon {spent:.4g} of the lifetime cap of 20, {20 - spent:.4g} left.",
    }  # fmt: skip
    largest = max(s["epsilon"] for s in report["sessions"])
    assert report["caps"][1]["spent"] == largest
    code, text = _cli(capsys, "report", "verify", str(tmp_path / "report.json"))
    assert code == 0 and "valid, signed by key" in text


def _visible_text(page: str) -> str:
    class Text(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.parts: list[str] = []
            self.hidden = 0

        def handle_starttag(self, tag: str, attrs: Any) -> None:
            self.hidden += tag in ("script", "style", "title")

        def handle_endtag(self, tag: str) -> None:
            self.hidden -= tag in ("script", "style", "title")

        def handle_data(self, data: str) -> None:
            if not self.hidden:
                self.parts.append(data)

    parser = Text()
    parser.feed(page)
    return " ".join(parser.parts)


def test_the_html_report_is_signed_and_any_altered_figure_is_caught(
    federation: Federation, report_key: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "report.html"
    page = _report(federation, report_key, out, capsys)
    text = _visible_text(page)
    for needed in (*LABELS, *PARTNERS, OPERATOR, "Against all the other partners together",
                   "percentage points more often than chance", "lifetime cap",
                   "What is not protected", "edges", "Signed"):  # fmt: skip
        assert needed in text, needed
    assert "<svg" in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    pub = str(report_key / "report-signing.pub")
    code, said = _cli(capsys, "report", "verify", str(out), "--key", pub)
    assert code == 0 and said.strip().endswith(_fingerprint(page))
    figures = sorted(set(re.findall(r"\d+\.\d+", text)))
    assert len(figures) > 10
    body = page.index("<body>")
    for figure in figures:
        # the first occurrence of each visible figure in a text node, one digit changed
        found = re.compile(r">[^<]*?(" + re.escape(figure) + ")").search(page, body)
        assert found is not None, figure
        at = found.start(1)
        last = figure[-1]
        altered = page[:at] + figure[:-1] + ("1" if last != "1" else "2") + page[at + len(figure) :]
        (tmp_path / "altered.html").write_text(altered, encoding="utf-8")
        code, said = _cli(capsys, "report", "verify", str(tmp_path / "altered.html"))
        assert code == 1 and "NOT valid: it was altered" in said, figure
    other = tmp_path / "other-key"
    assert main(["report", "keygen", "--out", str(other)]) == 0
    code, said = _cli(
        capsys, "report", "verify", str(out), "--key", str(other / "report-signing.pub")
    )
    assert code == 1 and "not by the given key" in said


def _fingerprint(page: str) -> str:
    found = re.search(r'"fingerprint": "([0-9a-f ]+)"', page)
    assert found is not None
    return found[1]


def test_the_operator_page_shows_the_same_sections(federation: Federation) -> None:
    first, second = federation.sessions
    sid = first["session_id"]
    path = f"/v1/sessions/{sid}/report"
    for token in (federation.admin_token, first["client_tokens"][2]):
        response = federation.get(path, token)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        text = _visible_text(response.text)
        needed = (LABELS[0], *PARTNERS, OPERATOR, "4 release(s)", "3 training", "1 evaluation",
                  "session target", "What is not protected", "Not signed",
                  "can be above it without any budget being overspent")  # fmt: skip
        for phrase in needed:
            assert phrase in text, phrase
    assert federation.get(path, second["client_tokens"][0]).status_code == 403
    assert federation.get(path, None).status_code == 401


def test_an_older_ledger_reads_as_before(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A ledger written before release kinds and session records: its rows count, their kind
    and partners say "not recorded"."""
    data = tmp_path / "old"
    data.mkdir()
    with sqlite3.connect(data / LEDGER_FILENAME) as db:
        db.executescript(
            "CREATE TABLE releases (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT"
            " NULL, pass_index INTEGER NOT NULL, noise_multiplier REAL NOT NULL, released_at REAL"
            " NOT NULL, layer INTEGER, release_digest TEXT);"
            "INSERT INTO releases (session_id, pass_index, noise_multiplier, released_at)"
            " VALUES ('old', 0, 10.0, 1.7e9), ('old', 1, 10.0, 1.7e9 + 60);"
        )
    key = tmp_path / "key"
    assert main(["report", "keygen", "--out", str(key)]) == 0
    code, _ = _cli(
        capsys, "report", "--local", str(data), "--out", str(tmp_path / "r.json"),
        "--signing-key", str(key / "report-signing.key"),
    )  # fmt: skip
    assert code == 0
    session = json.loads((tmp_path / "r.json").read_text())["report"]["sessions"][0]
    assert session["releases"] == 2 and session["by_kind"] == {"not recorded": 2}
    assert session["partners"] is None and session["first_release_at"] == "2023-11-14T22:13:20Z"


def test_budget_reads_one_consistent_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A worker writing while `glasu budget --local` reads: a session's figure never counts rows
    the lifetime figure does not (it printed 3.427 for a session, 3.029 for the lifetime)."""
    data = tmp_path / "data"
    with OwnerLedger.beside(data) as ledger:
        for i in range(20):
            ledger.record(session_id="s", pass_index=i, noise_multiplier=5.0, kind="training")
    original = OwnerLedger.sessions

    def sessions_then_a_release(self: OwnerLedger) -> Any:
        found = original(self)
        with OwnerLedger.beside(data) as worker:  # the worker's next release, meanwhile
            worker.record(session_id="s", pass_index=99, noise_multiplier=0.5)
        return found

    monkeypatch.setattr(OwnerLedger, "sessions", sessions_then_a_release)
    code, text = _cli(capsys, "budget", "--local", str(data), "--json")
    assert code == 0
    budget = json.loads(text)
    twenty = composed_epsilon(inverse_square_sum=20 / 5.0**2, delta=1e-6, accountant="rdp")
    assert budget["releases"] == 20 and budget["sessions"][0]["releases"] == 20
    assert budget["epsilon"] == pytest.approx(twenty, rel=1e-12)  # the 20 releases it counts
    assert budget["sessions"][0]["epsilon"] == pytest.approx(twenty, rel=1e-12)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_both_pages_in_a_real_browser(
    federation: Federation, report_key: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary (apt-get install chromium): the browser check skips")
    report = tmp_path / "report.html"
    _report(federation, report_key, report, capsys)
    sid = federation.sessions[0]["session_id"]
    page = tmp_path / "session.html"
    page.write_text(federation.get(f"/v1/sessions/{sid}/report", federation.admin_token).text)
    flags = ["--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    for path, needed in ((report, LABELS[1]), (page, LABELS[0])):
        dom = subprocess.run(
            [browser, *flags, "--dump-dom", path.as_uri()],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
        text = _visible_text(dom)
        for expected in (needed, "Bank A", OPERATOR, "percentage points more often than chance",
                         "What is not protected"):  # fmt: skip
            assert expected in text, (path, expected)
        assert "<svg" in dom
        shot = tmp_path / f"{path.stem}.png"
        subprocess.run(
            [browser, *flags, f"--screenshot={shot}", "--window-size=1200,2000", path.as_uri()],
            capture_output=True, timeout=120, check=True,
        )  # fmt: skip
        assert shot.stat().st_size > 10_000
        with capsys.disabled():
            print(f"\nscreenshot: {shot}")


def test_an_altered_json_report_fails(
    federation: Federation, report_key: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _report(federation, report_key, tmp_path / "r.json", capsys)
    document = json.loads((tmp_path / "r.json").read_text())
    document["report"]["total"]["epsilon"] *= 0.5
    (tmp_path / "r.json").write_text(json.dumps(document))
    code, said = _cli(capsys, "report", "verify", str(tmp_path / "r.json"))
    assert code == 1 and "altered" in said


def test_the_session_body_carries_partners(cora) -> None:
    body = {**session_request(replace(CONFIG), layout_federation(CONFIG, cora), cora)}
    from secure.wire.sessions import SessionCreate

    parsed = SessionCreate.model_validate({**body, "partners": PARTNERS, "operator": OPERATOR})
    assert parsed.partners == PARTNERS and parsed.operator == OPERATOR
