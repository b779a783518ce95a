"""Ordinary failures are one line for people, with an exit code that says which kind; problem
details from the service become one sentence."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from clients.cli import budget_cmd
from clients.cli.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    CliError,
)
from clients.cli.main import main
from clients.service_http import ServiceError, ServiceUnavailable, describe_problem
from tests.clients.cli.conftest import clean_env

# -- problem details -> one sentence ----------------------------------------------------------


def test_a_validation_problem_lists_each_field_and_its_message() -> None:
    problem = {
        "type": "https://glasu.dev/problems/validation-error",
        "title": "Validation error",
        "status": 422,
        "detail": "body.clients: Input should be less than or equal to 64; body.privacy.delta: "
        "Input should be less than 1",
        "instance": "/v1/sessions",
        "errors": [
            {"loc": ["body", "clients"], "msg": "Input should be less than or equal to 64"},
            {"loc": ["body", "privacy", "delta"], "msg": "Input should be less than 1"},
        ],
    }
    assert describe_problem(problem, action="to create the session") == (
        "the service refused to create the session (422 validation-error): clients: Input "
        "should be less than or equal to 64; privacy.delta: Input should be less than 1"
    )


def test_other_problems_give_their_detail_or_title() -> None:
    closed = {
        "type": "https://glasu.dev/problems/session-closed",
        "title": "Session closed",
        "status": 409,
        "detail": "session 'abc' has been closed",
    }
    assert describe_problem(closed) == (
        "the service refused the request (409 session-closed): session 'abc' has been closed"
    )
    assert describe_problem({"title": "Forbidden"}, status=403, action="to close session 'x'") == (
        "the service refused to close session 'x' (403): Forbidden"
    )
    assert describe_problem({}, status=502) == (
        "the service refused the request (502): no reason given"
    )


def test_service_error_describes_itself_and_keeps_the_workers_message() -> None:
    problem = {"type": "https://glasu.dev/problems/wrong-pass", "detail": "current pass 0"}
    error = ServiceError(409, problem, "PUT", "/v1/sessions/s/clients/0/passes/1/metrics")
    assert (
        str(error)
        == "PUT /v1/sessions/s/clients/0/passes/1/metrics -> 409 wrong-pass: current pass 0"
    )
    assert error.slug == "wrong-pass"
    assert error.describe() == (
        "the service refused PUT /v1/sessions/s/clients/0/passes/1/metrics (409 wrong-pass): "
        "current pass 0"
    )


# -- main: one line per failure, the exit code says which kind ---------------------------------

BUDGET = ["budget", "--server", "http://127.0.0.1:9", "--session", "s"]


def _failing_with(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    def run(args: argparse.Namespace) -> int:
        raise exc

    monkeypatch.setattr(budget_cmd, "run", run)


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (CliError("the token file t is empty"), EXIT_FAILED, "error: the token file t is empty"),
        (
            ServiceError(404, {"detail": "no session with id 's'"}, "GET", "/v1/sessions/s",
                         action="to show session 's'"),
            EXIT_REFUSED,
            "error: the service refused to show session 's' (404): no session with id 's'",
        ),
        (
            ServiceUnavailable("cannot reach the service at http://h: ConnectError: refused"),
            EXIT_UNREACHABLE,
            "error: cannot reach the service at http://h: ConnectError: refused",
        ),
        (
            httpx.ConnectError("refused", request=httpx.Request("GET", "http://h:8/v1/x")),
            EXIT_UNREACHABLE,
            "error: cannot reach the service at http://h:8: ConnectError: refused",
        ),
        (
            FileNotFoundError(2, "No such file or directory", "/no/such/token"),
            EXIT_FAILED,
            "error: No such file or directory: /no/such/token",
        ),
        (KeyboardInterrupt(), EXIT_INTERRUPTED, "interrupted"),
    ],
)  # fmt: skip
def test_failures_are_one_line(
    exc: BaseException,
    code: int,
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    _failing_with(monkeypatch, exc)
    assert main(BUDGET) == code
    assert capsys.readouterr().err == f"glasu budget: {line}\n"


def test_a_bug_still_shows_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_with(monkeypatch, KeyError("unexpected"))
    with pytest.raises(KeyError):
        main(BUDGET)


def test_debug_logging_adds_the_traceback_of_a_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    _failing_with(monkeypatch, CliError("no luck"))
    assert main(["--log-level", "debug", *BUDGET]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("glasu budget: error: no luck\n")


def test_budget_against_an_unreachable_service_is_one_line(glasu) -> None:
    done = glasu(*BUDGET, GLASU_ADMIN_TOKEN="any-token")
    assert done.returncode == EXIT_UNREACHABLE, done.stderr
    assert done.stdout == ""
    assert done.stderr == (
        "glasu budget: error: cannot reach the service at http://127.0.0.1:9: ConnectError: "
        "[Errno 111] Connection refused\n"
    )


def test_budget_without_a_token_or_with_a_missing_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(BUDGET) == EXIT_FAILED
    assert capsys.readouterr().err == (
        "glasu budget: error: give --token-file or set GLASU_ADMIN_TOKEN\n"
    )
    missing = tmp_path / "nope.token"
    assert main([*BUDGET, "--token-file", str(missing)]) == EXIT_FAILED
    assert capsys.readouterr().err == (
        "glasu budget: error: cannot read the token file given by --token-file: "
        f"No such file or directory: {missing}\n"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["keygen", "--out", "{tmp}/keys"],  # a command's own output
        ["train", "--help"],  # argparse's
    ],
)
def test_a_reader_that_stops_reading_ends_the_command_quietly(
    tmp_path: Path, args: list[str]
) -> None:
    """`glasu budget ... | head -2`: no "error: Broken pipe", no "Exception ignored"."""
    command = [sys.executable, "-m", "clients.cli.main", *(a.format(tmp=tmp_path) for a in args)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the command writes anything
    err = process.stderr.read()
    assert process.wait(timeout=120) in (0, 1)
    assert err == ""


def test_a_ledger_that_cannot_be_used_is_one_sentence(tmp_path: Path) -> None:
    """Every command finds the owner's ledger through one helper: the ledger's ValueError
    becomes "privacy ledger: <reason>", a failure (exit 1) and not a traceback."""
    import json

    from clients.cli.options import ledger_in
    from clients.cli.worker_cmd import ledger_path
    from clients.owner_ledger import ORGANISATION_KEY
    from models.data.party import META

    (tmp_path / META).write_text(json.dumps({ORGANISATION_KEY: "no such/name"}))
    reason = r"^privacy ledger: 'no such/name' cannot name an organisation"
    with pytest.raises(CliError, match=reason) as failed:
        ledger_in(tmp_path)
    assert failed.value.exit_code == EXIT_FAILED
    settings = argparse.Namespace(data=tmp_path, ledger=None)
    with pytest.raises(CliError, match=reason):
        ledger_path(settings)  # type: ignore[arg-type]


def test_a_failed_scoring_names_the_command_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Not "glasu score: error: glasu score: ...": the prefix once, then what failed."""
    from clients.cli import score_cmd
    from clients.local import scoring
    from models.artefact import ModelError

    def fail(*args: object, **kwargs: object) -> None:
        raise ModelError("the models come from different trainings")

    monkeypatch.setattr(score_cmd, "check", lambda args: setattr(args, "owner_ledgers", None))
    monkeypatch.setattr(scoring, "score_locally", fail)
    argv = ["score", "--party", str(tmp_path), "--model-dir", str(tmp_path), "--out",
            str(tmp_path / "out"), "--quiet"]  # fmt: skip
    assert main(argv) == EXIT_FAILED
    assert capsys.readouterr().err == (
        "glasu score: error: the scoring failed: the models come from different trainings\n"
    )
