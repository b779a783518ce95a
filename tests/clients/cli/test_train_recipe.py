"""`glasu train`'s recipe (models.recipe) meets the command line: it fills in only the settings
not given, and prints what it chose and why. Parsing only: nothing trains."""

from __future__ import annotations

import pytest

from clients.cli import train_config
from clients.cli.main import build_parser


def _config(argv: list[str], capsys: pytest.CaptureFixture[str], labelled: int | None = 140):
    args = build_parser().parse_args(["train", *argv])
    base = train_config.config_from_args(args)
    return train_config.with_recipe(base, args, labelled=labelled), capsys.readouterr().out


def test_sign_takes_the_recipe_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    config, printed = _config(["--backbone", "sign", "--no-dp", "--no-he"], capsys)
    assert (config.batch_size, config.stale, config.layers, config.agg_layers) == (140, 1, 1, 1)
    assert printed.startswith("recipe for --backbone sign")
    for flag in ("--batch-size 140", "--stale 1", "--layers 1", "--agg-layers 1"):
        assert flag in printed


def test_an_explicit_flag_wins_even_at_the_default_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--backbone", "sign", "--no-dp", "--no-he", "--batch-size", "16", "--stale", "4"]
    config, printed = _config(argv, capsys)
    assert (config.batch_size, config.stale, config.layers) == (16, 4, 1)
    assert "--batch-size" not in printed and "--stale" not in printed


def test_without_privacy_the_backbone_not_given_is_sign_with_its_recipe(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config, printed = _config(["--no-dp", "--no-he"], capsys)
    assert (config.backbone, config.batch_size, config.layers) == ("sign", 140, 1)
    assert "--backbone sign" in printed


def test_a_backbone_given_keeps_the_defaults_and_prints_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--backbone", "gcnii", "--no-dp", "--no-he"], ["--backbone", "gcnii"]):
        args = build_parser().parse_args(["train", *argv])
        base = train_config.config_from_args(args)
        assert train_config.with_recipe(base, args, labelled=140) == base
        assert base.backbone == "gcnii"
        assert capsys.readouterr().out == ""


def test_a_private_run_without_a_backbone_runs_the_private_sign_design(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Under differential privacy (the default) the recipe chooses sign, which runs the private
    sign design, and says why."""
    config, printed = _config(["--no-he"], capsys)
    assert (config.backbone, config.dp, config.layers) == ("sign", True, 1)
    assert "--backbone sign" in printed and "private sign design" in printed


def test_sign_under_privacy_runs_with_its_settings_and_keeps_its_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The private sign design (docs/privacy.md 3.8): `--transport inprocess` takes sign's recipe
    and the release's cap and floor; through the service too (a release session), and both keep
    a model (--model-dir)."""

    argv = ["--backbone", "sign", "--no-he", "--sign-occurrence-cap", "3", "--sign-degree-floor"]
    config, printed = _config([*argv, "4", "--transport", "inprocess"], capsys)
    assert (config.backbone, config.dp, config.layers) == ("sign", True, 1)
    assert (config.sign_occurrence_cap, config.sign_degree_floor) == (3, 4)
    assert printed.startswith("recipe for --backbone sign")
    args = build_parser().parse_args(["train", *argv, "4", "--transport", "inprocess"])
    train_config.check_federation(args, through_service=False)
    train_config.check_federation(args, through_service=True)
    args.model_dir = "models"  # a private sign model is kept (models/private_sign_model.py)
    train_config.check_federation(args, through_service=True)
