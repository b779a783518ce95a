"""The options of a training run, shared by ``glasu train`` and ``glasu session create``: their
defaults, help, per-value checks (argparse types), the checks across options, and the
``TrainConfig`` they make.

Torch-free: ``models.config`` (the defaults) loads neither torch nor the accountants' backends.
The service's limits come from ``secure.wire`` (pydantic only).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, get_args

from clients.cli.errors import UsageError
from clients.cli.options import (
    BooleanGiven,
    StoreGiven,
    fraction,
    given_options,
    int_range,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    rate,
    switch_note,
)
from models.config import DEVICE_NAMES, TrainConfig
from secure.accounting import ACCOUNTANTS
from secure.protocol import StragglerPolicy
from secure.wire.common import MAX_CLIENTS, MAX_LAYERS, MAX_ROUNDS, MAX_WIDTH

DEFAULTS = TrainConfig()

# secure.ckks_context.MAX_SHARES, for the help text (a test keeps them equal); the check below
# reads the real one.
CKKS_MAX_CLIENTS = 16

DATASETS = ("cora", "citeseer", "pubmed")
MODES = ("glasu", "centralized", "standalone", "simulated")
DATA_DIR_HELP = (
    "dataset root, the folder holding Cora/raw (default: $GLASU_DATA, else a per-user cache); "
    "it must be writable: the first use writes the processed graph beside raw/"
)
# What only differential privacy reads: refused with --no-dp when given explicitly.
PRIVACY_OPTIONS = (
    "--epsilon",
    "--delta",
    "--noise-multiplier",
    "--clip",
    "--accountant",
    "--release-width",
    "--occurrence-cap",
    "--shared-noise",
)


def device_name(text: str) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether this machine has it:
    ``options.check_device``)."""
    if not DEVICE_NAMES.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}")
    return text


def add_data_arguments(p: argparse._ActionsContainer) -> None:
    p.add_argument("--dataset", choices=DATASETS, default=DEFAULTS.dataset, help="graph dataset")
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR", help=DATA_DIR_HELP)
    p.add_argument(
        "--split",
        choices=["paper", "public"],
        default=DEFAULTS.split,
        help="train/validation/test split: paper = the GLASU authors' seeded random split, "
        "public = Planetoid's",
    )


def add_federation_arguments(p: argparse._ActionsContainer, *, local: bool) -> None:
    """M, L, K, Q, T and the sampling; ``local`` adds the options only ``glasu train`` has
    (mode, backbone, the local optimiser, device)."""
    p.add_argument(
        "--clients",
        type=positive_int,
        default=DEFAULTS.clients,
        metavar="M",
        help=f"organisations, each holding a block of the features (at most {MAX_CLIENTS} "
        f"through the service, {CKKS_MAX_CLIENTS} with encryption)",
    )
    if local:
        p.add_argument(
            "--mode",
            choices=MODES,
            default=DEFAULTS.mode,
            help="glasu: the federated algorithm; centralized: one client holds everything; "
            "standalone: each client trains alone; simulated: aggregation at every layer "
            "and step",
        )
        p.add_argument(
            "--backbone",
            choices=["gcnii", "gcn", "gat"],
            default=DEFAULTS.backbone,
            help="graph layers of the split GNN",
        )
    p.add_argument(
        "--layers",
        type=int_range(1, MAX_LAYERS),
        default=DEFAULTS.layers,
        metavar="L",
        help="GNN layers",
    )
    p.add_argument(
        "--agg-layers",
        type=positive_int,
        default=DEFAULTS.agg_layers,
        metavar="K",
        help="layers whose embeddings meet at the service (lazy aggregation, K <= L)",
    )
    p.add_argument(
        "--stale",
        type=positive_int,
        default=DEFAULTS.stale,
        metavar="Q",
        help="local steps per communication round (stale updates)",
    )
    p.add_argument(
        "--label-holder",
        type=int_range(0, MAX_CLIENTS - 1),
        default=None,
        metavar="M",
        help="only client M holds the labels and the split; the others learn from the gradient "
        "it broadcasts through the service, encrypted (GLASU Appendix B.2); with --mode "
        "standalone: client M alone. Default: every client holds the labels",
    )
    p.add_argument(
        "--stragglers",
        choices=get_args(StragglerPolicy),
        default=DEFAULTS.stragglers,
        help="when a client is late: 'wait' for it (every pass holds every client), or "
        "'continue' (3 clients or more) without it after --straggler-wait-seconds; it rejoins at "
        "a later pass (docs/protocol.md). Default: %(default)s",
    )
    p.add_argument(
        "--straggler-wait-seconds",
        type=positive_float,
        default=DEFAULTS.straggler_wait_seconds,
        metavar="S",
        help="with --stragglers continue: how long a layer waits after its first upload "
        "(default: %(default)s)",
    )
    if local:  # each worker's own choice; a deployed worker takes them as its settings
        p.add_argument(
            "--cache-rounds",
            type=positive_int,
            default=DEFAULTS.cache_rounds,
            metavar="W",
            help="rounds of stale statistics the local steps reuse round-robin (CELU-VFL; 1: the "
            "round's own batch only)",
        )
        p.add_argument(
            "--instance-weighting",
            action=argparse.BooleanOptionalAction,
            default=None,  # set below: one way to show defaults
            help=f"weight each instance of a local step by the cosine between its current and its "
            f"cached output, 0 below --weight-threshold (CELU-VFL) "
            f"{switch_note(DEFAULTS.instance_weighting)}",
        )
        p.set_defaults(instance_weighting=DEFAULTS.instance_weighting)
        p.add_argument(
            "--weight-threshold",
            type=float,
            default=DEFAULTS.weight_threshold,
            metavar="COS",
            help="cos(xi) of the instance weighting: instances less similar get weight 0",
        )
    p.add_argument(
        "--rounds",
        type=int_range(1, MAX_ROUNDS),
        default=DEFAULTS.rounds,
        metavar="T",
        help="communication rounds",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULTS.batch_size,
        metavar="N",
        help="output nodes per training round",
    )
    p.add_argument(
        "--fanout",
        type=positive_int,
        default=DEFAULTS.fanout,
        metavar="N",
        help="neighbours sampled per node and layer in training",
    )
    if local:
        p.add_argument(
            "--eval-fanout",
            type=positive_int,
            default=DEFAULTS.eval_fanout,
            metavar="N",
            help="neighbours sampled per node and layer in evaluation",
        )
    p.add_argument(
        "--eval-every",
        type=non_negative_int,
        default=DEFAULTS.eval_every,
        metavar="N",
        help="evaluate every N rounds and after the last (0: only after the last)",
    )
    p.add_argument(
        "--hidden",
        type=positive_int,
        default=DEFAULTS.hidden,
        metavar="WIDTH",
        help="hidden width of the local layers",
    )
    if local:
        p.add_argument(
            "--dropout", type=rate, default=DEFAULTS.dropout, metavar="P", help="dropout rate"
        )
        p.add_argument(
            "--lr", type=positive_float, default=DEFAULTS.lr, metavar="RATE", help="learning rate"
        )
        p.add_argument(
            "--weight-decay",
            type=non_negative_float,
            default=DEFAULTS.weight_decay,
            metavar="W",
            help="weight decay (L2 penalty) of the optimiser",
        )
        p.add_argument(
            "--edge-fraction",
            type=fraction,
            default=DEFAULTS.edge_fraction,
            metavar="F",
            help="share of the graph's edges each client holds (glasu and standalone modes)",
        )
    p.add_argument(
        "--seed",
        type=non_negative_int,
        default=DEFAULTS.seed,
        help="seeds the split, the partition, the batches and the initialisation",
    )
    if local:
        p.add_argument(
            "--device",
            type=device_name,
            default=DEFAULTS.device,
            metavar="{auto,cpu,cuda,cuda:N}",
            help="where the clients compute (auto: CUDA when available)",
        )


def add_session_about_arguments(p: argparse._ActionsContainer) -> None:
    """Who takes part and who runs it, stored with the session and in each worker's ledger
    (its owner's ``glasu report`` names them)."""
    p.add_argument(
        "--partner",
        dest="partners",
        action="append",
        default=None,
        metavar="NAME",
        help="an organisation taking part, by the name people know it by (give it once per "
        "organisation); each worker's ledger and privacy report name them",
    )
    p.add_argument(
        "--operator",
        default=None,
        metavar="NAME",
        help="who runs the service and the session (named in each owner's privacy report)",
    )


def session_about(args: argparse.Namespace) -> dict[str, Any]:
    """The session body's ``partners`` and ``operator`` fields that were given."""
    about = {"partners": args.partners, "operator": args.operator}
    return {k: v for k, v in about.items() if v is not None}


def add_encryption_argument(p: argparse._ActionsContainer) -> None:
    p.add_argument(
        "--no-he",
        dest="encryption",
        action="store_const",
        const="none",
        default=DEFAULTS.encryption,
        help="switch CKKS encryption off (on by default): the clients send plaintext float32 "
        "shares, which the service can read",
    )


def add_privacy_arguments(p: argparse._ActionsContainer, *, noise_seed: bool = True) -> None:
    """The session's privacy options; ``noise_seed`` adds the worker-side test option."""
    p.add_argument(
        "--no-dp",
        dest="dp",
        action="store_false",
        help="switch differential privacy off (on by default): no clipping, no noise, no "
        "(epsilon, delta) guarantee",
    )
    p.add_argument(
        "--epsilon",
        action=StoreGiven,
        type=positive_float,
        default=None,
        help=f"epsilon target of the whole run (default: {DEFAULTS.epsilon}, unless "
        "--noise-multiplier is given)",
    )
    p.add_argument(
        "--delta",
        action=StoreGiven,
        type=probability,
        default=DEFAULTS.delta,
        help="delta of the (epsilon, delta) guarantee, in (0, 1)",
    )
    p.add_argument(
        "--noise-multiplier",
        action=StoreGiven,
        type=positive_float,
        default=None,
        metavar="Z",
        help="noise std of the aggregate / sensitivity (default: calibrated from --epsilon "
        "over every pass)",
    )
    p.add_argument(
        "--clip",
        action=StoreGiven,
        type=positive_float,
        default=DEFAULTS.clip,
        metavar="C",
        help="L2 bound of every released row",
    )
    p.add_argument(
        "--accountant",
        action=StoreGiven,
        choices=ACCOUNTANTS,
        default=DEFAULTS.accountant,
        help="privacy accountant: rdp (Renyi DP) or prv (privacy random variables)",
    )
    p.add_argument(
        "--release-width",
        action=StoreGiven,
        type=int_range(1, MAX_WIDTH),
        default=DEFAULTS.release_width,
        metavar="WIDTH",
        help="columns of the noisy layer-1 release",
    )
    p.add_argument(
        "--occurrence-cap",
        action=StoreGiven,
        type=non_negative_int,
        default=DEFAULTS.occurrence_cap,
        metavar="C",
        help="times a node may be drawn as a neighbour per layer, up to the release",
    )
    p.add_argument(
        "--shared-noise",
        dest="shared_noise",
        action=BooleanGiven,
        default=None,  # set below: a default here would add "(default: False)" to the help
        help=f"shared noise {switch_note(DEFAULTS.shared_noise)}, with encryption only: each "
        "client adds only its 1/M share of the noise; less noise, but the guarantee then holds "
        "against one curious peer, not against colluding ones",
    )
    p.set_defaults(shared_noise=DEFAULTS.shared_noise)
    if not noise_seed:
        return
    p.add_argument(
        "--noise-seed",
        type=non_negative_int,
        default=None,
        metavar="SEED",
        help="fix the DP noise (tests only: refused unless GLASU_TEST_REPRODUCIBLE_NOISE=1, and "
        "the report then says NOT PRIVATE)",
    )


# -- checks across options ---------------------------------------------------------------------


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
