"""From a training run's parsed options (``train_options``) to its ``TrainConfig``: the checks
across options that the per-value types cannot see, then the configuration itself.

Torch-free, like the parser: ``glasu train`` and ``glasu session create`` fail here, with exit
code 2, before anything starts.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from clients.cli.errors import UsageError
from clients.cli.options import given_options
from clients.cli.train_options import DEFAULTS
from models.config import TrainConfig
from models.recipe import choose_recipe
from secure.wire.common import MAX_CLIENTS, MAX_WIDTH
from secure.wire.sessions import check_masks

# What only differential privacy reads: refused with --no-dp when given explicitly.
PRIVACY_OPTIONS = (
    "--epsilon",
    "--delta",
    "--noise-multiplier",
    "--clip",
    "--accountant",
    "--release-width",
    "--occurrence-cap",
    "--release",
    "--degree-floor",
    "--sign-occurrence-cap",
    "--sign-degree-floor",
    "--shared-noise",
    "--split-noise",
)


def releases_anything(args: argparse.Namespace) -> bool:
    """Centralized and standalone training send nothing to anyone."""
    return getattr(args, "mode", "glasu") in ("glasu", "simulated")


def check_federation(args: argparse.Namespace, *, through_service: bool) -> None:
    """What the per-option types cannot see: K <= L, and M within what the service and CKKS
    take (``secure.wire.common.MAX_CLIENTS``, ``secure.ckks_context.MAX_SHARES``)."""
    mode = getattr(args, "mode", "glasu")
    if mode == "glasu" and args.agg_layers > args.layers:
        raise UsageError(
            f"--agg-layers K={args.agg_layers} is more than --layers L={args.layers}: "
            "K layers out of L meet at the service"
        )
    if args.label_holder is not None and args.label_holder >= args.clients:
        raise UsageError(
            f"--label-holder {args.label_holder} is not a client (0..{args.clients - 1})"
        )
    if not releases_anything(args):
        return
    if args.clients < 2:
        raise UsageError(
            f"--clients {args.clients}: a federation needs 2 clients or more (--mode "
            "centralized or standalone trains without one)"
        )
    check_privacy_options(args)
    if args.stragglers == "continue" and args.clients < 3:
        raise UsageError(
            "--stragglers continue needs 3 clients or more: a pass goes on with 2 clients at "
            "least, so with 2 it waits for both anyway"
        )
    if getattr(args, "secure_aggregation", "none") == "masks":
        try:
            check_masks(clients=args.clients, encryption=args.encryption)
        except ValueError as exc:
            flag = "--secure-aggregation masks"
            raise UsageError(str(exc).replace("secure aggregation 'masks'", flag)) from None
    if through_service and args.clients > MAX_CLIENTS:
        raise UsageError(
            f"--clients {args.clients}: the service takes at most {MAX_CLIENTS} clients"
        )
    if args.encryption == "ckks":
        from secure.ckks_context import MAX_SHARES  # TenSEAL, no torch

        if args.clients > MAX_SHARES:
            raise UsageError(
                f"--clients {args.clients}: CKKS encryption is sized for at most {MAX_SHARES} "
                "clients; use fewer clients or switch encryption off with --no-he"
            )
    private = getattr(args, "dp", False)
    if private and getattr(args, "shared_noise", False) and args.encryption != "ckks":
        raise UsageError(
            "--shared-noise needs encryption: without it the service would see each client's "
            "share with only 1/M of the noise (drop --no-he or --shared-noise)"
        )
    if private and getattr(args, "shared_noise", False) and args.stragglers == "continue":
        raise UsageError(
            "--stragglers continue needs unshared noise: with --shared-noise a pass without a "
            "straggler would carry less noise than the ledger counts"
        )
    if private and getattr(args, "split_noise", None) and args.stragglers == "continue":
        raise UsageError(
            "--stragglers continue needs unsplit noise: with --split-noise a pass that goes on "
            "over fewer clients would carry less noise than the ledger counts"
        )
    if through_service and not private and args.hidden > MAX_WIDTH:
        raise UsageError(
            f"--hidden {args.hidden}: the service aggregates at most {MAX_WIDTH} columns"
        )


def check_privacy_options(args: argparse.Namespace) -> None:
    """With --no-dp, a privacy option given would silently do nothing."""
    if getattr(args, "dp", True):
        return
    given = [flag for flag in PRIVACY_OPTIONS if flag in given_options(args)]
    if given:
        raise UsageError(
            f"--no-dp switches differential privacy off, so {', '.join(given)} would do "
            "nothing: drop " + ("it" if len(given) == 1 else "them") + " or --no-dp"
        )


def config_from_args(args: argparse.Namespace, **overrides: Any) -> TrainConfig:
    """The ``models.config.TrainConfig`` of these options."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    values.update(overrides)
    if values.get("epsilon") is None and values.get("noise_multiplier") is None:
        values["epsilon"] = DEFAULTS.epsilon
    try:
        return TrainConfig(**values)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def with_recipe(
    config: TrainConfig, args: argparse.Namespace, *, labelled: int | None
) -> TrainConfig:
    """``config`` with ``models.recipe``'s choices for the settings the command line did not
    give; prints what it chose and why (one block)."""
    given = given_options(args)
    recipe = choose_recipe(
        backbone=config.backbone if "--backbone" in given else None,
        labelled=labelled,
        private=config.private,
    )
    chosen, taken = recipe.apply(config, given=given)
    if recipe.choices:
        print(taken.describe(), flush=True)
    return chosen
