"""`glasu session create|status|close` against a real `glasu serve` on loopback (moved here from
tests/deploy/ with the CLI's other tests)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from clients.admin import AdminClient
from clients.cli.errors import EXIT_FAILED, EXIT_REFUSED, EXIT_UNREACHABLE
from clients.cli.main import main
from clients.cli.session_cmd import describe
from clients.local.processes import free_port, start_serve, without_glasu_settings
from clients.local.session import session_request
from clients.session_fit import session_defaultable
from models.config import TrainConfig
from models.layout import layout_federation
from models.recipe import choose_recipe
from secure.schedule import pass_schedule


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("session-cmd")
    from secure.ckks import generate_keys

    _, public = generate_keys(root / "keys")
    # a token file that ends in a newline, as an editor leaves it
    served = start_serve(
        root, admin_token=secrets.token_urlsafe(32) + "\n",
        extra_args=["--public-context", str(public)], env=without_glasu_settings(),
    )  # fmt: skip
    try:
        served.wait_healthy()
        yield {"url": served.url, "token_file": str(served.admin_token_file), "root": str(root)}
    finally:
        served.stop(grace=10)


def _create(server: dict[str, str], out: Path, data_dir: Path, *extra: str) -> int:
    return main(
        ["session", "create", "--server", server["url"], "--admin-token-file",
         server["token_file"], "--dataset", "cora", "--data-dir", str(data_dir),
         "--rounds", "5", "--eval-every", "2", "--hidden", "32", "--out", str(out), *extra]
    )  # fmt: skip


def _admin(server: dict[str, str]) -> AdminClient:
    token = Path(server["token_file"]).read_text().strip()
    return AdminClient(base_url=server["url"], token=token)


def test_create_writes_the_session_and_private_token_files(
    server: dict[str, str], tmp_path: Path, data_dir: Path, cora, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "session"
    # a message-passing backbone: passes through the service (the default's one release is
    # test_the_recipe_chooses_the_backbone_when_not_given's)
    assert _create(server, out, data_dir, "--backbone", "gcnii") == 0
    summary = json.loads((out / "session.json").read_text())
    expected_passes = len(pass_schedule(rounds=5, eval_every=2))
    assert summary["passes_total"] == expected_passes
    assert summary["encryption"] == "ckks" and summary["clients"] == 3
    assert (out / "session.id").read_text() == summary["session_id"]
    tokens = [(out / f"client-{m}.token") for m in range(3)]
    assert all(t.stat().st_mode & 0o777 == 0o600 for t in tokens)
    assert len({t.read_text() for t in tokens}) == 3
    assert summary["session_id"] in capsys.readouterr().out
    # The session is the one `glasu train --backbone gcnii` builds from the same settings:
    # private by default.
    config = TrainConfig(rounds=5, eval_every=2, hidden=32, data_dir=data_dir)
    body = session_request(config, layout_federation(config, cora), cora)
    with _admin(server) as admin:
        status = admin.session(summary["session_id"])
    view = status["config"]
    assert view["agg_layers"] == body["agg_layers"] and view["stale"] == body["stale"]
    assert view["train_nodes_count"] == body["train_nodes"]["count"] == cora.train_nodes.size
    assert view["eval_nodes_count"] == body["eval_nodes"]["count"]
    assert view["privacy"]["epsilon"] == 4.0 and summary["privacy"]["epsilon"] == 4.0
    assert status["privacy"]["epsilon_planned"] <= 4.0
    # A client token works for the worker's first call.
    token = tokens[1].read_text().strip()
    response = httpx.get(
        f"{server['url']}/v1/sessions/{summary['session_id']}/clients/1/passes/0",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200 and response.json()["kind"] == "train"


def test_no_he_makes_a_plaintext_session(
    server: dict[str, str], tmp_path: Path, data_dir: Path
) -> None:
    assert _create(server, tmp_path, data_dir, "--no-he", "--clients", "2") == 0
    summary = json.loads((tmp_path / "session.json").read_text())
    assert summary["encryption"] == "none" and summary["clients"] == 2
    assert not (tmp_path / "client-2.token").exists()


def test_switching_dp_off_is_said_loudly(
    server: dict[str, str], tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    assert _create(server, tmp_path, data_dir, "--no-dp") == 0
    captured = capsys.readouterr()
    assert "WARNING: differential privacy is OFF" in captured.err
    assert "differential privacy OFF" in captured.out
    assert json.loads((tmp_path / "session.json").read_text())["privacy"] is None


def test_status_names_the_missing_clients_and_close_closes(
    server: dict[str, str], tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    # GLASU's own arrangement (no DP; gcnii, not the recipe's backbone) has an aggregation
    # layer below the top to exchange
    assert _create(server, tmp_path, data_dir, "--no-dp", "--backbone", "gcnii") == 0
    sid = (tmp_path / "session.id").read_text()
    token = (tmp_path / "client-0.token").read_text().strip()
    # Client 0 uploads its node set for the highest aggregation layer below the top one.
    with _admin(server) as admin:
        status = admin.session(sid)
    lower = [a["layer"] for a in status["config"]["agg_layers"] if a["layer"] < 4]
    nodes = [0, 1, 2]  # any sorted, distinct, in-range ids
    for m in range(3):  # the session's join gate: every client says it is ready first
        ready = httpx.put(
            f"{server['url']}/v1/sessions/{sid}/clients/{m}/readiness",
            json={"ready": True},
            headers={
                "Authorization": f"Bearer {(tmp_path / f'client-{m}.token').read_text().strip()}"
            },
        )
        assert ready.status_code == 204, ready.text
    put = httpx.put(
        f"{server['url']}/v1/sessions/{sid}/clients/0/passes/0/layers/{lower[-1]}/nodes",
        content=b"".join(n.to_bytes(8, "little") for n in nodes),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream",
                 "X-Glasu-Encoding": "int64", "X-Glasu-Shape": str(len(nodes))},
    )  # fmt: skip
    assert put.status_code == 201, put.text
    capsys.readouterr()
    args = ["--server", server["url"], "--admin-token-file", server["token_file"], "--session", sid]
    assert main(["session", "status", *args]) == 0
    shown = capsys.readouterr().out
    assert f"session {sid}" in shown and "running, pass 0 of" in shown
    assert f"current step: layer {lower[-1]} node sets from [0], missing [1, 2]\n" in shown
    assert "differential privacy off" in shown and "  join: every client said ready\n" in shown
    assert main(["session", "status", *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "running"
    assert main(["session", "close", *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "closed"
    assert main(["session", "close", *args]) == 0  # closing again changes nothing
    assert capsys.readouterr().out.startswith(
        f"session {sid} (glasu session create cora): closed, pass"
    )
    assert main(["session", "status", *args]) == 0
    assert ": closed, pass" in capsys.readouterr().out


def test_list_shows_every_session_across_pages(
    server: dict[str, str], tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    created = []
    for i in range(3):
        assert _create(server, tmp_path / f"s{i}", data_dir, "--label", f"listed {i}") == 0
        created.append((tmp_path / f"s{i}" / "session.id").read_text())
    with _admin(server) as admin:  # pages of 2: the Link header is followed
        listed = [s["session_id"] for s in admin.sessions(page_size=2)]
    assert listed[-3:] == created and len(listed) == len(set(listed))
    capsys.readouterr()
    args = ["--server", server["url"], "--admin-token-file", server["token_file"]]
    assert main(["session", "list", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(listed)
    assert lines[-1].startswith(created[-1]) and lines[-1].endswith("listed 2")
    assert "running" in lines[-1] and "pass 0 of" in lines[-1]
    assert main(["session", "list", *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["label"] == "listed 2"


def test_errors_are_one_clear_line(
    server: dict[str, str], tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text(secrets.token_urlsafe(32))
    code = main(
        ["session", "status", "--server", server["url"], "--admin-token-file", str(wrong),
         "--session", "nope"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == EXIT_REFUSED, err
    assert err == (
        "glasu session status: error: the service refused to show session 'nope' "
        "(401 unauthorized): the bearer token is not valid\n"
    )
    code = main(
        ["session", "close", "--server", f"http://127.0.0.1:{free_port()}", "--admin-token-file",
         server["token_file"], "--session", "nope"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == EXIT_UNREACHABLE and err.count("\n") == 1, err
    assert "glasu session close: error: cannot reach the service at http://127.0.0.1:" in err
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    code = main(
        ["session", "status", "--server", server["url"], "--admin-token-file", str(empty),
         "--session", "nope"]
    )  # fmt: skip
    assert code == EXIT_FAILED and "is empty" in capsys.readouterr().err


def test_create_stores_the_partners_and_the_operator(
    server: dict[str, str], tmp_path: Path, data_dir: Path, cora
) -> None:
    """Each worker's ledger and privacy report name them: they are part of the session."""
    out = tmp_path / "named"
    named = ["--label", "churn model", "--partner", "Bank A", "--partner", "Telco B",
             "--partner", "Retailer C", "--operator", "Consortium Ops"]  # fmt: skip
    assert _create(server, out, data_dir, *named) == 0
    summary = json.loads((out / "session.json").read_text())
    assert summary["partners"] == ["Bank A", "Telco B", "Retailer C"]
    with _admin(server) as admin:
        view = admin.session(summary["session_id"])["config"]
    assert view["label"] == "churn model"
    assert view["partners"] == ["Bank A", "Telco B", "Retailer C"]
    assert view["operator"] == "Consortium Ops"


def _recipe_for_workers(labelled: int) -> dict[str, object]:
    """The sign recipe's choices of each worker's own settings (hops, learning rate, ...)."""
    recipe = choose_recipe(backbone="sign", labelled=labelled)
    return {c.field: c.value for c in recipe.choices if c.field in session_defaultable()}


def _view(server: dict[str, str], out: Path) -> dict:
    summary = json.loads((out / "session.json").read_text())
    with _admin(server) as admin:
        return admin.session(summary["session_id"])["config"]


def test_a_sign_session_takes_the_recipe_and_prints_it(
    server: dict[str, str], tmp_path: Path, data_dir: Path, cora, capsys: pytest.CaptureFixture
) -> None:
    """`--backbone sign` without the settings: the recipe's, printed as `glasu train` prints
    them, in the session every worker reads (with its backbone, and the choices of each
    worker's own settings as the workers' defaults)."""
    assert _create(server, tmp_path, data_dir, "--backbone", "sign", "--no-dp", "--no-he") == 0
    printed = capsys.readouterr().out
    labelled = cora.train_nodes.size
    assert printed.startswith("recipe for --backbone sign (a flag given wins):")
    for flag in (f"--batch-size {labelled}", "--stale 1", "--layers 1", "--agg-layers 1"):
        assert flag in printed
    assert "backbone sign" in printed.splitlines()[-1]
    assert json.loads((tmp_path / "session.json").read_text())["backbone"] == "sign"
    view = _view(server, tmp_path)
    assert (view["batch_size"], view["stale"], view["layers"]) == (labelled, 1, 1)
    assert [a["layer"] for a in view["agg_layers"]] == [1] and view["backbone"] == "sign"
    for_workers = _recipe_for_workers(labelled)
    assert (view["worker_defaults"] or {}) == for_workers
    for name, value in for_workers.items():
        assert f"--{name.replace('_', '-')} {value}" in printed
        assert f"--{name.replace('_', '-')} {value}" in printed.splitlines()[-2]


def test_a_flag_given_to_a_sign_session_wins(
    server: dict[str, str], tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ("--backbone", "sign", "--no-dp", "--no-he", "--batch-size", "32")
    assert _create(server, tmp_path, data_dir, *argv) == 0
    printed = capsys.readouterr().out
    assert "--batch-size" not in printed and "--stale 1" in printed
    view = _view(server, tmp_path)
    assert (view["batch_size"], view["stale"], view["layers"]) == (32, 1, 1)


def test_the_recipe_chooses_the_backbone_when_not_given(
    server: dict[str, str], tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    """As in `glasu train`: the recipe's backbone and its settings, without differential privacy
    and under it (where sign makes a session of kind "release", the private sign design)."""
    chosen = choose_recipe(backbone=None, labelled=None, private=False).backbone
    assert _create(server, tmp_path / "plain", data_dir, "--no-dp", "--no-he") == 0
    assert f"--backbone {chosen}" in capsys.readouterr().out
    assert _view(server, tmp_path / "plain")["backbone"] == chosen
    assert _create(server, tmp_path / "private", data_dir, "--no-he") == 0
    assert "--backbone sign" in capsys.readouterr().out
    view = _view(server, tmp_path / "private")
    assert (view["backbone"], view["kind"], view["layers"]) == ("sign", "release", 1)


def test_a_recipe_choice_of_a_worker_s_own_setting_goes_to_the_workers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A learning rate is each worker's own setting: the session carries it as the workers'
    default, and says so; a session setting goes into the configuration."""
    from clients.cli import session_cmd, train_config
    from clients.cli.main import build_parser
    from models.recipe import Choice, Recipe

    recipe = Recipe("sign", (Choice("batch_size", 64, "why"), Choice("lr", 0.05, "why")))
    monkeypatch.setattr(train_config, "choose_recipe", lambda **_: recipe)
    args = build_parser().parse_args(
        ["session", "create", "--server", "https://unused", "--admin-token-file", "unused",
         "--out", "unused", "--backbone", "sign", "--no-dp"]
    )  # fmt: skip
    config = train_config.config_from_args(args)
    chosen, for_workers = session_cmd.session_recipe(config, args, labelled=None)
    assert (chosen.batch_size, chosen.lr) == (64, 0.05) and for_workers == {"lr": 0.05}
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("the session's defaults for its workers' own settings: --lr 0.05 (")


def test_a_worker_s_own_setting_given_to_session_create_goes_to_the_workers(
    server: dict[str, str], tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    """`--lr` wins over the recipe's, and reaches the workers as the session's default."""
    argv = ("--backbone", "sign", "--no-dp", "--no-he", "--lr", "0.05")
    assert _create(server, tmp_path, data_dir, *argv) == 0
    printed = capsys.readouterr().out
    assert "--lr 0.05" in printed and "  --lr" not in printed  # given: not in the block
    assert _view(server, tmp_path)["worker_defaults"]["lr"] == 0.05


def test_share_predictions_is_a_scoring_session_s_and_every_session_has_the_join_gate(
    server: dict[str, str], tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    assert _create(server, tmp_path / "a", data_dir, "--share-predictions", "label-holder") == 2
    assert "give --score-with" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    assert _create(server, tmp_path / "b", data_dir, "--no-dp") == 0
    with _admin(server) as admin:
        config = admin.session((tmp_path / "b" / "session.id").read_text())["config"]
    assert config["ready_gate"] and config["share_predictions"] == "none"


def test_status_says_who_refused_at_join_and_why() -> None:
    why = "request 3 replays the signed request of s-2 (its nonce was used before)"
    status = {"session_id": "s-3", "label": None, "state": "closed", "current_pass": 0,
              "passes_total": 1, "progress": None, "privacy": {"enabled": False},
              "readiness": [{"client": 0, "state": "ready"}, {"client": 1, "state": "waiting"},
                            {"client": 2, "state": "refused", "reason": why}]}  # fmt: skip
    assert f"  join: client 0 ready, client 1 waiting, client 2 refused ({why})" in describe(status)
