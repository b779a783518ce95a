"""Bad arguments are refused at once (exit code 2: one line and where the usage is), before any
dataset, torch or process is touched; output paths that cannot be written are refused before
training; a service whose port is taken stops before it creates anything."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from clients.cli import session_cmd, train_cmd
from clients.cli.errors import EXIT_FAILED, EXIT_USAGE
from clients.cli.main import main


def _nothing_may_start(*args: object, **kwargs: object) -> None:
    raise AssertionError("the command started although its arguments are invalid")


@pytest.fixture(autouse=True)
def _no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train_cmd, "run", _nothing_may_start)
    monkeypatch.setattr(session_cmd, "run", _nothing_may_start)


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors
        return int(exc.code or 0)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--rounds", "-1"], "argument --rounds: must be an integer from 1 to 100000, got -1"),
        (["--rounds", "many"], "argument --rounds: expected an integer, got 'many'"),
        (["--epsilon", "0"], "argument --epsilon: must be > 0, got 0"),
        (["--delta", "2"], "argument --delta: must be strictly between 0 and 1, got 2"),
        (["--delta", "0"], "argument --delta: must be strictly between 0 and 1"),
        (["--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got 0"),
        (["--clip", "-1"], "argument --clip: must be > 0"),
        (["--lr", "nan"], "argument --lr: expected a finite number, got 'nan'"),
        (["--dropout", "1"], "argument --dropout: must be >= 0 and < 1, got 1"),
        (["--edge-fraction", "0"], "argument --edge-fraction: must be > 0 and <= 1"),
        (["--threads", "0"], "argument --threads: must be an integer >= 1, got 0"),
        (["--layers", "17"], "argument --layers: must be an integer from 1 to 16, got 17"),
        (["--eval-every", "-2"], "argument --eval-every: must be an integer >= 0, got -2"),
        (["--agg-layers", "5"], "--agg-layers K=5 is more than --layers L=4"),
        (["--layers", "2", "--agg-layers", "3"], "--agg-layers K=3 is more than --layers L=2"),
        (["--clients", "50"], "--clients 50: CKKS encryption is sized for at most 16 clients"),
        (["--clients", "65", "--no-he"], "--clients 65: the service takes at most 64 clients"),
        (["--mode", "flat"], "argument --mode: invalid choice: 'flat'"),
        (["--shared-noise", "--no-he"], "--shared-noise needs encryption"),
        (["--label-holder", "3"], "--label-holder 3 is not a client (0..2)"),
        (["--nodes", "union"], "--nodes union needs --party"),
        (["--clients", "2", "--stragglers", "continue"], "--stragglers continue needs 3 clients"),
        (["--stragglers", "continue", "--shared-noise"], "--stragglers continue needs unshared"),
        (["--straggler-wait-seconds", "0"], "argument --straggler-wait-seconds: must be > 0"),
        (["--stragglers", "maybe"], "argument --stragglers: invalid choice: 'maybe'"),
        (
            ["--secure-aggregation", "masks", "--clients", "2"],
            "--secure-aggregation masks needs 3 clients or more",
        ),
        (["--secure-aggregation", "masks", "--no-he"], "--secure-aggregation masks needs encrypt"),
        (
            ["--secure-aggregation", "masks", "--stragglers", "continue", "--split-noise"],
            "--stragglers continue needs unsplit noise",
        ),
        (["--clients", "1"], "--clients 1: a federation needs 2 clients or more"),
        (["--clients", "1", "--mode", "simulated"], "--clients 1: a federation needs 2 clients"),
        (
            ["--no-dp", "--noise-multiplier", "3"],
            "--no-dp switches differential privacy off, so --noise-multiplier would do nothing",
        ),
        (
            ["--no-dp", "--epsilon", "4", "--clip", "1", "--accountant", "rdp", "--shared-noise"],
            "--no-dp switches differential privacy off, so --epsilon, --clip, --accountant, "
            "--shared-noise would do nothing: drop them or --no-dp",
        ),
        (["--no-dp", "--delta", "1e-5"], "--no-dp switches differential privacy off, so --delta"),
        (["--device", "tpu"], "argument --device: expected auto, cpu, cuda or cuda:N, got 'tpu'"),
        (["--plot", "/proc/glasu-history.png"], "--plot /proc/glasu-history.png: cannot create"),
        (["--report", "/proc/glasu/r.json"], "--report /proc/glasu/r.json: cannot create"),
    ],
)
def test_train_refuses_bad_values_at_once(
    argv: list[str], says: str, capsys: pytest.CaptureFixture
) -> None:
    code = _exit_code(["train", *argv])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    error, hint = err.splitlines()  # one line, and where the usage is: no usage text
    assert error.startswith(f"glasu train: error: {says}"), err
    assert hint == "run `glasu train --help` for usage"
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--clients", "50", "--no-he"],  # no CKKS: up to the service's 64
        ["--clients", "200", "--no-he", "--transport", "inprocess"],  # no service at all
        ["--clients", "40", "--mode", "standalone"],  # nothing is released
        ["--mode", "centralized", "--layers", "1"],  # K is not used outside glasu mode
        ["--clients", "1", "--mode", "standalone"],  # one client training alone
        ["--clients", "1", "--mode", "centralized"],
        ["--no-dp", "--no-shared-noise"],  # agrees with --no-dp
        ["--epsilon", "2", "--clip", "0.5"],  # with DP on
        ["--device", "cpu"],
    ],
)
def test_train_accepts_what_fits(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    reached = []
    monkeypatch.setattr(train_cmd, "run", lambda args: reached.append(args) or 0)
    assert _exit_code(["train", *argv]) == 0
    assert len(reached) == 1


def test_session_create_checks_like_train(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["session", "create", "--server", "http://127.0.0.1:9", "--admin-token-file", "t"]
    assert _exit_code([*base, "--out", str(tmp_path), "--clients", "17"]) == EXIT_USAGE
    assert "CKKS encryption is sized for at most 16 clients" in capsys.readouterr().err
    monkeypatch.setattr(session_cmd, "run", lambda args: 0)
    assert _exit_code([*base, "--out", str(tmp_path), "--clients", "17", "--no-he"]) == 0
    monkeypatch.setattr(session_cmd, "run", _nothing_may_start)
    afile = tmp_path / "afile"
    afile.write_text("")
    assert _exit_code([*base, "--out", str(afile / "sub")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"glasu session create: error: --out {afile / 'sub'} is under the file {afile}" in err


def _a_file(folder: Path) -> Path:
    (folder / "f").write_text("")
    return folder / "f"


@pytest.mark.parametrize(
    ("make_path", "says"),
    [
        (lambda tmp: Path("/etc/passwd/x.json"), "/etc/passwd is a file, not a directory"),
        (lambda tmp: tmp, "is a directory; give a file name"),
        (lambda tmp: _a_file(tmp) / "a" / "b.json", "is a file, not a directory"),
    ],
)
def test_an_unwritable_report_fails_before_training(
    make_path: Callable[[Path], Path],
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    report = make_path(tmp_path)
    code = _exit_code(
        ["train", "--transport", "inprocess", "--rounds", "1", "--report", str(report)]
    )
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert f"glasu train: error: --report {report}" in err and says in err


def test_an_unknown_plot_format_fails_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert _exit_code(["train", "--plot", str(tmp_path / "history.txt")]) == EXIT_USAGE
    assert "unknown format 'txt'" in capsys.readouterr().err


def test_a_missing_report_directory_is_fine(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(train_cmd, "run", lambda args: 0)
    assert _exit_code(["train", "--report", str(tmp_path / "new" / "dir" / "r.json")]) == 0


def test_in_a_fresh_interpreter_the_refusal_is_one_usage_error(glasu) -> None:
    done = glasu("train", "--rounds", "-1", "--epsilon", "4")
    assert done.returncode == EXIT_USAGE
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "glasu train: error: argument --rounds: must be an integer from 1 to 100000, got -1",
        "run `glasu train --help` for usage",
    ]
    assert "Traceback" not in done.stderr


def test_service_settings_are_checked_before_the_service_starts(glasu, tmp_path: Path) -> None:
    port = glasu("serve", "--port", "70000")
    assert port.returncode == EXIT_USAGE
    assert "argument --port: Input should be less than or equal to 65535" in port.stderr
    no_token = glasu("serve", "--dry-run", "--database", str(tmp_path / "db.sqlite3"))
    assert no_token.returncode == EXIT_USAGE
    assert "glasu serve: error: invalid settings: an admin token is required" in no_token.stderr
    assert "Traceback" not in no_token.stderr
    worker = glasu("worker", "--session", "s")
    assert worker.returncode == EXIT_USAGE
    assert "--server (or GLASU_SERVER) is required" in worker.stderr
    assert "Traceback" not in worker.stderr


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--dataset", "cora"], "--party trains the organisations' own data: drop --dataset"),
        (["--dataset", "pubmed", "--split", "public", "--edge-fraction", "0.5"],
         "own data: drop --dataset, --split, --edge-fraction (a benchmark dataset's)"),
        (["--data-dir", "data"], "--party trains the organisations' own data: drop --data-dir"),
        (["--clients", "3"], "--clients 3: there is one client per --party, 2 here"),
    ],
)  # fmt: skip
def test_train_with_parties_refuses_the_options_of_a_benchmark(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--party replaces the benchmark dataset: its options are refused, not silently ignored
    (--clients as many as the parties is no contradiction)."""
    parties = []
    for name in ("bank", "insurer"):
        (tmp_path / name).mkdir()
        parties += ["--party", str(tmp_path / name)]
    assert _exit_code(["train", *parties, *argv]) == EXIT_USAGE
    assert "glasu train: error: " in (err := capsys.readouterr().err) and says in err
    with pytest.raises(AssertionError, match="started"):  # checked, then run
        _exit_code(["train", *parties, "--clients", "2", "--transport", "inprocess"])


def test_a_port_in_use_is_one_line_and_leaves_no_database(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    database = tmp_path / "service.sqlite3"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code = _exit_code(["serve", "--host", "127.0.0.1", "--port", str(port), "--database",
                           str(database), "--admin-token", "a" * 32])  # fmt: skip
    assert code == EXIT_FAILED
    assert capsys.readouterr().err == (
        f"glasu serve: error: the service cannot start: cannot listen on 127.0.0.1:{port} "
        "(another process listens there: stop it or give another --port)\n"
    )
    assert list(tmp_path.iterdir()) == []  # no database, no payload folder


def test_session_create_refuses_one_client_and_privacy_options_without_dp(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    base = ["session", "create", "--server", "http://127.0.0.1:9", "--admin-token-file", "t"]
    assert _exit_code([*base, "--out", str(tmp_path), "--clients", "1"]) == EXIT_USAGE
    assert "--clients 1: a federation needs 2 clients or more" in capsys.readouterr().err
    assert _exit_code([*base, "--out", str(tmp_path), "--no-dp", "--epsilon", "1"]) == EXIT_USAGE
    assert "so --epsilon would do nothing" in capsys.readouterr().err


def test_an_existing_report_or_plot_needs_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    report, plot = tmp_path / "r.json", tmp_path / "h.png"
    report.write_text("{}")
    plot.write_bytes(b"")
    for flag, path in (("--report", report), ("--plot", plot)):
        assert _exit_code(["train", flag, str(path)]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert f"glasu train: error: {flag} {path} exists; pass --overwrite to replace it" in err
    monkeypatch.setattr(train_cmd, "run", lambda args: 0)
    argv = ["train", "--report", str(report), "--plot", str(plot), "--overwrite"]
    assert _exit_code(argv) == 0


def test_train_takes_cuda_n_where_the_machine_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    reached = []
    monkeypatch.setattr(train_cmd, "run", lambda args: reached.append(args.device) or 0)
    assert _exit_code(["train", "--device", "cuda:1"]) == 0
    assert reached == ["cuda:1"]
    assert _exit_code(["train", "--device", "cuda:2"]) == EXIT_USAGE


def test_a_missing_gpu_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _exit_code(["train", "--device", "cuda:0"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "glasu train: error: --device cuda:0 was requested but no CUDA device" in err
    token = tmp_path / "token"
    token.write_text("t" * 32)
    worker = ["worker", "--server", "http://127.0.0.1:9", "--session", "s", "--client", "0",
              "--token-file", str(token), "--data", str(tmp_path / "no-such-folder"),
              "--device", "cuda"]  # fmt: skip
    assert _exit_code(worker) == EXIT_USAGE  # before the data (which does not exist here)
    err = capsys.readouterr().err
    assert (
        "glasu worker: error: --device cuda was requested but no CUDA device is available"
        in err.splitlines()
    )


def test_keygen_into_existing_keys_names_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "secret.context").write_bytes(b"a secret")
    assert _exit_code(["keygen", "--out", str(tmp_path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "glasu keygen: error: --out" in err and "pass --overwrite to replace them" in err
    assert (tmp_path / "secret.context").read_bytes() == b"a secret"
