"""The options of a training run, shared by ``glasu train`` and ``glasu session create``: their
defaults (``TrainConfig``'s), help and per-value checks (argparse types). The checks across
options and the ``TrainConfig`` they make: ``train_config``.

Torch-free: ``models.config`` (the defaults) loads neither torch nor the accountants' backends.
The service's limits come from ``secure.wire`` (pydantic only).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from clients.cli.errors import UsageError, failing_as
from clients.cli.options import (
    BooleanGiven,
    StoreGiven,
    fraction,
    int_range,
    ledger_errors,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    rate,
    switch_note,
)
from clients.policy import PrivacyPolicy
from models.config import DEVICE_NAMES, BackboneName, FeatureScaleName, Mode, TrainConfig
from secure.accounting import ACCOUNTANTS
from secure.dp import RELEASE_KINDS
from secure.protocol import StragglerPolicy
from secure.wire.common import MAX_CLIENTS, MAX_LAYERS, MAX_ROUNDS, MAX_WIDTH

if TYPE_CHECKING:
    from clients.owner_ledger import PartyLedgers
    from models.data.planetoid import GraphDataset

DEFAULTS = TrainConfig()

# secure.ckks_context.MAX_SHARES, for the help text (a test keeps them equal); the check below
# reads the real one.
CKKS_MAX_CLIENTS = 16

DATASETS = ("cora", "citeseer", "pubmed")
MODES = get_args(Mode)
BACKBONES = get_args(BackboneName)
DATA_DIR_HELP = (
    "dataset root, the folder holding Cora/raw (default: $GLASU_DATA, else a per-user cache); "
    "it must be writable: the first use writes the processed graph beside raw/"
)


def device_name(text: str) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether this machine has it:
    ``options.check_device``)."""
    if not DEVICE_NAMES.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}")
    return text


def add_setting(p: argparse._ActionsContainer, flag: str, help: str, **kwargs: Any) -> None:
    """An option whose default is ``TrainConfig``'s field of the same name (``--agg-layers``:
    ``agg_layers``), so that the two cannot disagree."""
    default = getattr(DEFAULTS, flag.removeprefix("--").replace("-", "_"))
    kwargs.setdefault("action", StoreGiven)  # given or not: the recipe fills the others in
    p.add_argument(flag, default=default, help=help, **kwargs)


def add_data_arguments(p: argparse._ActionsContainer) -> None:
    add_setting(p, "--dataset", "graph dataset", choices=DATASETS)
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR", help=DATA_DIR_HELP)
    add_setting(
        p,
        "--split",
        "train/validation/test split: paper = the GLASU authors' seeded random split, "
        "public = Planetoid's",
        choices=["paper", "public"],
    )


def add_edge_fraction_argument(p: argparse._ActionsContainer, note: str | None = None) -> None:
    """``--edge-fraction`` of a benchmark dataset's partition (``glasu train``, ``glasu
    partition``); ``note``: when it applies."""
    text = "share of the graph's edges each client holds"
    add_setting(
        p, "--edge-fraction", f"{text} {note}" if note else text, type=fraction, metavar="F"
    )


def load_benchmark(choice: argparse.Namespace | TrainConfig) -> GraphDataset:
    """The dataset that ``--dataset``, ``--data-dir``, ``--split`` and ``--seed`` name (torch is
    imported here); a dataset that cannot be loaded fails the command in one sentence."""
    from models.data.planetoid import load_dataset

    with failing_as(f"cannot load the {choice.dataset} dataset", ValueError, OSError, RuntimeError):
        return load_dataset(
            choice.dataset, data_dir=choice.data_dir, split=choice.split, seed=choice.seed
        )


def add_federation_arguments(p: argparse._ActionsContainer, *, local: bool) -> None:
    """M, L, K, Q, T and the sampling; ``local`` adds the options only ``glasu train`` has
    (mode, backbone, the local optimiser, device)."""
    add_setting(
        p,
        "--clients",
        f"organisations, each holding a block of the features (at most {MAX_CLIENTS} "
        f"through the service, {CKKS_MAX_CLIENTS} with encryption)",
        type=positive_int,
        metavar="M",
    )
    if local:
        add_setting(
            p,
            "--mode",
            "glasu: the federated algorithm; centralized: one client holds everything; "
            "standalone: each client trains alone; simulated: aggregation at every layer "
            "and step",
            choices=MODES,
        )
        add_setting(
            p,
            "--backbone",
            "graph layers of the split GNN; sign: each client's features propagated --hops "
            "hops over its own graph once, before training, then an MLP (no neighbour sampling; "
            "not under differential privacy)",
            choices=BACKBONES,
        )
        add_setting(
            p,
            "--hops",
            "hops of the sign backbone's precomputed propagation (K of SGC and SIGN)",
            type=non_negative_int,
            metavar="K",
        )
        add_setting(
            p,
            "--feature-scale",
            "how the sign backbone scales each party's propagated columns, measured on its own "
            "table: column (standardised), hop (one number per hop), auto (hop for a sparse "
            "table, more than half zeros; column otherwise)",
            choices=get_args(FeatureScaleName),
        )
    add_setting(p, "--layers", "GNN layers", type=int_range(1, MAX_LAYERS), metavar="L")
    add_setting(
        p,
        "--agg-layers",
        "layers whose embeddings meet at the service (lazy aggregation, K <= L)",
        type=positive_int,
        metavar="K",
    )
    add_setting(
        p,
        "--stale",
        "local steps per communication round (stale updates)",
        type=positive_int,
        metavar="Q",
    )
    add_setting(
        p,
        "--label-holder",
        "only client M holds the labels and the split; the others learn from the gradient "
        "it broadcasts through the service, encrypted (GLASU Appendix B.2); with --mode "
        "standalone: client M alone. Default: every client holds the labels",
        type=int_range(0, MAX_CLIENTS - 1),
        metavar="M",
    )
    add_setting(
        p,
        "--stragglers",
        "when a client is late: 'wait' for it (every pass holds every client), or "
        "'continue' (3 clients or more) without it after --straggler-wait-seconds; it rejoins at "
        "a later pass (docs/protocol.md). Default: %(default)s",
        choices=get_args(StragglerPolicy),
    )
    add_setting(
        p,
        "--straggler-wait-seconds",
        "with --stragglers continue: how long a layer waits after its first upload "
        "(default: %(default)s)",
        type=positive_float,
        metavar="S",
    )
    if local:  # each worker's own choice; a deployed worker takes them as its settings
        add_setting(
            p,
            "--cache-rounds",
            "rounds of stale statistics the local steps reuse round-robin (CELU-VFL; 1: the "
            "round's own batch only)",
            type=positive_int,
            metavar="W",
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
        add_setting(
            p,
            "--weight-threshold",
            "cos(xi) of the instance weighting: instances less similar get weight 0",
            type=float,
            metavar="COS",
        )
    add_setting(p, "--rounds", "communication rounds", type=int_range(1, MAX_ROUNDS), metavar="T")
    add_setting(
        p, "--batch-size", "output nodes per training round", type=positive_int, metavar="N"
    )
    add_setting(
        p,
        "--fanout",
        "neighbours sampled per node and layer in training",
        type=positive_int,
        metavar="N",
    )
    if local:
        add_setting(
            p,
            "--eval-fanout",
            "neighbours sampled per node and layer in evaluation",
            type=positive_int,
            metavar="N",
        )
    add_setting(
        p,
        "--eval-every",
        "evaluate every N rounds and after the last (0: only after the last)",
        type=non_negative_int,
        metavar="N",
    )
    add_setting(
        p, "--hidden", "hidden width of the local layers", type=positive_int, metavar="WIDTH"
    )
    if local:
        add_setting(p, "--dropout", "dropout rate", type=rate, metavar="P")
        add_setting(p, "--lr", "learning rate", type=positive_float, metavar="RATE")
        add_setting(
            p,
            "--weight-decay",
            "weight decay (L2 penalty) of the optimiser",
            type=non_negative_float,
            metavar="W",
        )
        add_edge_fraction_argument(p, "(glasu and standalone modes)")
    add_setting(
        p,
        "--seed",
        "seeds the split, the partition, the batches and the initialisation",
        type=non_negative_int,
    )
    if local:
        add_setting(
            p,
            "--device",
            "where the clients compute (auto: CUDA when available)",
            type=device_name,
            metavar="{auto,cpu,cuda,cuda:N}",
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
    p.add_argument(
        "--secure-aggregation",
        choices=("none", "masks"),
        default=DEFAULTS.secure_aggregation,
        help="masks: every share masked with pairwise masks that cancel only in the sum of all "
        "of them and encrypted under BFV, so neither the service nor the service with one "
        "worker reads a share (3 clients or more, with encryption; under --stragglers continue "
        "a pass that loses a client is redone over the others; docs/secure-aggregation.md). "
        "Default: none, CKKS without masks: one key for every worker, no per-organisation keys "
        "to pin out of band when deployed, and it runs with 2 clients and scoring; masks cost "
        "about the same time and bytes (docs/results.md) and, with DP, split the noise by "
        "default",
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
    add_setting(
        p,
        "--delta",
        "delta of the (epsilon, delta) guarantee, in (0, 1)",
        action=StoreGiven,
        type=probability,
    )
    add_setting(
        p,
        "--noise-multiplier",
        "noise std of the aggregate / sensitivity (default: calibrated from --epsilon "
        "over every pass)",
        action=StoreGiven,
        type=positive_float,
        metavar="Z",
    )
    add_setting(
        p,
        "--clip",
        "L2 bound of every released row",
        action=StoreGiven,
        type=positive_float,
        metavar="C",
    )
    add_setting(
        p,
        "--accountant",
        "privacy accountant: rdp (Renyi DP) or prv (privacy random variables)",
        action=StoreGiven,
        choices=ACCOUNTANTS,
    )
    add_setting(
        p,
        "--release-width",
        "columns of the noisy layer-1 release",
        action=StoreGiven,
        type=int_range(1, MAX_WIDTH),
        metavar="WIDTH",
    )
    add_setting(
        p,
        "--occurrence-cap",
        "times a node may be drawn as a neighbour per layer, up to the release",
        action=StoreGiven,
        type=non_negative_int,
        metavar="C",
    )
    add_setting(
        p,
        "--release",
        "how each client's layer-1 release is formed (docs/privacy.md 3.7): clip-after "
        "aggregates, then clips each row to C (sensitivity 2C sqrt(c+1)); degree-normalised "
        "clips each node's own row to C, then divides the neighbourhood's sum by "
        "max(degree, --degree-floor) (2C sqrt(c+1) / d_min)",
        action=StoreGiven,
        choices=RELEASE_KINDS,
    )
    add_setting(
        p,
        "--degree-floor",
        "d_min of --release degree-normalised: a fixed setting, not a statistic of the graph",
        action=StoreGiven,
        type=positive_int,
        metavar="D_MIN",
    )
    add_setting(
        p,
        "--sign-occurrence-cap",
        "c of --backbone sign's one release under DP (the private sign design, docs/privacy.md "
        "3.8): a node enters at most c + 1 rows of it",
        type=non_negative_int,
        metavar="C",
    )
    add_setting(
        p,
        "--sign-degree-floor",
        "d_min of --backbone sign's one release under DP: each row divided by max(degree, "
        "d_min), sensitivity 2C sqrt(c + 1) / d_min",
        type=positive_int,
        metavar="D_MIN",
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
    p.add_argument(
        "--split-noise",
        dest="split_noise",
        action=BooleanGiven,
        default=None,
        help="split discrete Gaussian noise, 3 clients or more, encrypted, accountant rdp "
        "(docs/privacy.md section 11): each client adds sigma^2/(M-1), so the sum less any one "
        "share carries sigma^2 (default: on with --secure-aggregation masks and --stragglers wait, "
        "where nobody reads a share; --no-split-noise keeps each client's full noise there)",
    )
    if not noise_seed:
        return
    add_setting(
        p,
        "--noise-seed",
        "fix the DP noise (tests only: refused unless GLASU_TEST_REPRODUCIBLE_NOISE=1, and "
        "the report then says NOT PRIVATE)",
        type=non_negative_int,
        metavar="SEED",
    )


def add_owner_ledger_arguments(p: argparse._ActionsContainer) -> None:
    """``--ledger`` (once per ``--party``) and ``--max-lifetime-epsilon``: where each
    organisation's releases are counted, across runs, and how much they may add up to."""
    p.add_argument(
        "--ledger",
        type=Path,
        action="append",
        default=None,
        metavar="PATH",
        help="once per --party, in the same order: the organisation's privacy ledger, where "
        "every release of its data is counted across runs and flows (default: the "
        "organisation's own, $XDG_DATA_HOME/glasu/ledgers/<organisation>.sqlite3, the name "
        "glasu prepare wrote into its folder; docs/data.md)",
    )
    p.add_argument(
        "--max-lifetime-epsilon",
        type=positive_float,
        default=PrivacyPolicy.max_lifetime_epsilon,
        metavar="EPSILON",
        help="the most epsilon all runs together may spend of each --party organisation's "
        "data, counted in its ledger; its worker refuses a run past it",
    )


def owner_ledgers(args: argparse.Namespace) -> PartyLedgers:
    """Each ``--party``'s organisation's ledger, with the run's lifetime cap; :class:`CliError`
    naming the problem (an older ledger beside the data, two folders of one organisation)."""
    from clients.owner_ledger import PartyLedgers, party_ledgers

    with ledger_errors():
        paths = party_ledgers(args.party, args.ledger)
    return PartyLedgers(paths=paths, max_lifetime_epsilon=args.max_lifetime_epsilon)


def check_ledger_arguments(args: argparse.Namespace) -> None:
    if args.ledger is not None and args.party is None:
        raise UsageError(
            "--ledger names each --party's ledger; a benchmark dataset's synthetic parties "
            "keep theirs in the run's own folder"
        )
    if args.ledger is not None and len(args.ledger) != len(args.party):
        raise UsageError(
            f"--ledger is given {len(args.ledger)} times for {len(args.party)} --party folders: "
            "give it once per --party, in the same order"
        )
