"""The parser a person reads: cheap to build (no torch for `glasu serve`), `--version`, help on
every option with defaults shown one way, switches that read as switches, and defaults equal to
the models' own."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from importlib import metadata

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from clients.cli.main import COMMANDS, build_parser, main
from clients.cli.options import HelpFormatter
from clients.cli.settings_args import (
    FieldFlag,
    add_field_arguments,
    add_settings_arguments,
    settings_from_args,
)
from clients.cli.train_options import CKKS_MAX_CLIENTS, DEFAULTS

# models.config (the training defaults) is torch-free; the rest of models is not
HEAVY = (
    "torch",
    "torch_geometric",
    "tenseal",
    "fastapi",
    "uvicorn",
    "scipy",
    "models.trainer",
    "models.federated",
)

PARSE_IN_A_FRESH_INTERPRETER = """
import contextlib, io, json, sys
from clients.cli.main import build_parser, main
parser = build_parser()
for argv in json.loads(sys.argv[1]):
    parser.parse_args(argv)
for command in ("serve", "worker", "train", "session"):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main([command, "--help"])
heavy = sorted(
    name for name in json.loads(sys.argv[2])
    if any(m == name or m.startswith(name + ".") for m in sys.modules)
)
print(json.dumps(heavy))
"""


def test_building_the_parser_and_parsing_loads_no_torch_models_or_app() -> None:
    """`glasu serve` is the service container's entrypoint: it must not pay for torch."""
    argvs = [
        ["serve", "--port", "8000", "--dry-run", "--log-level", "warning"],
        ["worker", "--server", "https://h:8443", "--client", "1", "--threads", "1"],
        ["train", "--rounds", "3", "--no-he", "--report", "r.json"],
        ["session", "status", "--server", "u", "--admin-token-file", "t", "--session", "s"],
        ["budget", "--server", "u", "--session", "s"],
    ]
    done = subprocess.run(
        [sys.executable, "-c", PARSE_IN_A_FRESH_INTERPRETER, json.dumps(argvs), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"glasu {metadata.version('glasu')}\n"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command's parser by its prog, e.g. "glasu session create"."""
    found: dict[str, argparse.ArgumentParser] = {}

    def visit(parser: argparse.ArgumentParser) -> None:
        found[parser.prog] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    visit(child)

    visit(build_parser())
    return found


def test_every_command_is_listed_and_every_option_has_help() -> None:
    parsers = _parsers()
    assert {f"glasu {name}" for name in COMMANDS} <= set(parsers)
    missing = [
        f"{prog} {action.option_strings[0]}"
        for prog, parser in parsers.items()
        for action in parser._actions
        if action.option_strings and not (action.help or "").strip()
    ]
    assert not missing, f"options without help: {missing}"
    for prog, parser in parsers.items():
        assert parser.formatter_class is HelpFormatter, prog


def test_a_usage_error_of_any_command_is_one_line_and_where_the_usage_is(
    capsys: pytest.CaptureFixture,
) -> None:
    """Every (sub)command, an unknown option or a missing argument: "glasu CMD: error: ..." and
    the line naming `glasu CMD --help`, not argparse's usage text (tens of lines for some)."""
    progs = [prog for prog in _parsers() if prog != "glasu"]
    for prog in progs:
        with pytest.raises(SystemExit) as stopped:
            main([*prog.split()[1:], "--no-such-option"])
        assert stopped.value.code == 2, prog
        error, hint = capsys.readouterr().err.splitlines()
        assert error.startswith(f"{prog}: error: "), error  # a required one, or the unknown one
        assert hint == f"run `{prog} --help` for usage"
    with pytest.raises(SystemExit):
        main(["budget", "--no-such-option"])  # said by the command it was given to
    assert capsys.readouterr().err.splitlines()[0] == (
        "glasu budget: error: unrecognized arguments: --no-such-option"
    )
    with pytest.raises(SystemExit):
        main(["session", "create"])
    assert capsys.readouterr().err.splitlines() == [
        "glasu session create: error: the following arguments are required: --server, "
        "--admin-token-file, --out",
        "run `glasu session create --help` for usage",
    ]


def test_defaults_are_shown_one_way(capsys: pytest.CaptureFixture) -> None:
    texts = {}
    for prog, parser in _parsers().items():
        texts[prog] = parser.format_help()
    everything = "\n".join(texts.values())
    assert "(default " not in everything  # the old "(default X)" of the settings flags
    assert "default: None" not in everything and "default: False" not in everything
    assert "default: True" not in everything
    train = " ".join(texts["glasu train"].split())
    assert "communication rounds (default: 300)" in train
    serve = " ".join(texts["glasu serve"].split())
    assert "[env GLASU_PORT] (default: 8000)" in serve
    worker = " ".join(texts["glasu worker"].split())
    assert "[env GLASU_SERVER] (required)" in worker


@pytest.mark.parametrize(
    ("prog", "flag", "says"),
    [
        ("glasu train", "--no-he", "switch CKKS encryption off (on by default)"),
        ("glasu train", "--no-dp", "switch differential privacy off (on by default)"),
        ("glasu train", "--shared-noise", "shared noise (off by default), with encryption"),
        ("glasu session create", "--no-he", "switch CKKS encryption off (on by default)"),
    ],
)
def test_switches_read_as_switches(prog: str, flag: str, says: str) -> None:
    parser = _parsers()[prog]
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    shown = HelpFormatter(prog)._get_help_string(action)
    assert shown.startswith(says), shown
    assert "default: True" not in shown and "default:" not in shown


class _Toggles(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GLASU_TEST_")

    metrics: bool = Field(True, description="Export Prometheus metrics.")
    verbose: bool = False
    retries: int = Field(3, ge=0, le=10, description="How often to retry.")


def test_boolean_settings_flags_are_switches_and_numbers_are_checked(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = argparse.ArgumentParser(prog="t", formatter_class=HelpFormatter)
    add_settings_arguments(parser, _Toggles)
    text = " ".join(parser.format_help().split())
    assert "--metrics, --no-metrics export Prometheus metrics [env GLASU_TEST_METRICS] (on by" in (
        text
    )
    assert "[env GLASU_TEST_VERBOSE] (off by default)" in text
    assert "how often to retry [env GLASU_TEST_RETRIES] (default: 3)" in text
    assert "default: True" not in text and "default: False" not in text
    # unset flags fall through to the environment, then to the field's default
    monkeypatch.setenv("GLASU_TEST_METRICS", "false")
    assert settings_from_args(_Toggles, parser.parse_args([])).metrics is False
    assert settings_from_args(_Toggles, parser.parse_args(["--metrics"])).metrics is True
    assert settings_from_args(_Toggles, parser.parse_args(["--retries", "7"])).retries == 7
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--retries", "11"])
    assert exited.value.code == 2
    assert "argument --retries: Input should be less than or equal to 10" in capsys.readouterr().err


def test_a_share_of_the_settings_keeps_their_types_bounds_and_defaults(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command that takes some settings' flags (`glasu report`, `glasu budget`) reads no
    environment: its defaults are the fields', shown as defaults, under its own names."""
    parser = argparse.ArgumentParser(prog="t", formatter_class=HelpFormatter)
    own = {"retries": FieldFlag("--tries", "tries"), "metrics": FieldFlag()}
    add_field_arguments(parser, _Toggles, own)
    text = " ".join(parser.format_help().split())
    assert "--tries TRIES tries (default: 3)" in text
    assert "--metrics, --no-metrics export Prometheus metrics (on by default)" in text
    assert "--verbose" not in text and "[env" not in text
    monkeypatch.setenv("GLASU_TEST_RETRIES", "5")
    assert vars(parser.parse_args([])) == {"tries": 3, "metrics": True}
    assert parser.parse_args(["--tries", "7", "--no-metrics"]).tries == 7
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--tries", "11"])
    assert exited.value.code == 2
    assert "argument --tries: Input should be less than or equal to 10" in capsys.readouterr().err


def test_the_policy_flags_of_report_and_budget_are_the_workers_settings() -> None:
    from clients.settings import WorkerSettings

    fields = WorkerSettings.model_fields
    parsers = _parsers()
    report = parsers["glasu report"].parse_args([])
    budget = parsers["glasu budget"].parse_args([])
    for name in ("max_session_epsilon", "max_lifetime_epsilon", "policy_delta"):
        assert getattr(report, name) == fields[name].default, name
    assert (budget.delta, budget.accountant) == (fields["policy_delta"].default, "rdp")
    assert report.policy_accountant == fields["policy_accountant"].default == "rdp"


def test_the_parsers_defaults_are_the_models() -> None:
    from models.config import TrainConfig

    expected = TrainConfig()
    assert expected == DEFAULTS
    train = _parsers()["glasu train"]
    parsed = train.parse_args([])
    for field in dataclasses.fields(DEFAULTS):
        if hasattr(parsed, field.name) and field.name != "epsilon":
            assert getattr(parsed, field.name) == getattr(expected, field.name), field.name


def test_the_limits_in_the_help_are_the_services_and_ckks() -> None:
    from secure.ckks_context import MAX_SHARES

    assert CKKS_MAX_CLIENTS == MAX_SHARES


def test_every_local_model_option_is_a_worker_setting() -> None:
    """`glasu worker` builds its local model's options from the settings of the same names: an
    option without a setting would silently keep its default."""
    from clients.session_fit import LocalModelOptions
    from clients.settings import WorkerSettings

    options = {field.name for field in dataclasses.fields(LocalModelOptions)}
    assert options <= set(WorkerSettings.model_fields)
