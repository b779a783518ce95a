"""``glasu train``: a whole federation on this machine."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from models.config import TrainConfig
from models.data import load_dataset
from models.layout import layout_federation
from models.report import RunReport, plot_history
from models.trainer import train_inprocess

DEFAULTS = TrainConfig()


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "train",
        help="train a federation on this machine",
        description="Run the service and one worker per client on this machine and train "
        "(or, with --transport inprocess, every client in this process).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--dataset", choices=["cora", "citeseer", "pubmed"], default=DEFAULTS.dataset)
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="dataset root (default: $GLASU_DATA, else a per-user cache)",
    )
    p.add_argument("--split", choices=["paper", "public"], default=DEFAULTS.split)
    p.add_argument("--clients", type=int, default=DEFAULTS.clients, help="M")
    p.add_argument(
        "--mode", choices=["glasu", "centralized", "standalone", "simulated"], default=DEFAULTS.mode
    )
    p.add_argument("--backbone", choices=["gcnii", "gcn", "gat"], default=DEFAULTS.backbone)
    p.add_argument("--layers", type=int, default=DEFAULTS.layers, help="L")
    p.add_argument("--agg-layers", type=int, default=DEFAULTS.agg_layers, help="K")
    p.add_argument("--stale", type=int, default=DEFAULTS.stale, help="Q, local steps per round")
    p.add_argument("--rounds", type=int, default=DEFAULTS.rounds, help="T")
    p.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size)
    p.add_argument("--fanout", type=int, default=DEFAULTS.fanout)
    p.add_argument("--eval-fanout", type=int, default=DEFAULTS.eval_fanout)
    p.add_argument(
        "--eval-every",
        type=int,
        default=DEFAULTS.eval_every,
        help="evaluate every N rounds (and after the last)",
    )
    p.add_argument("--hidden", type=int, default=DEFAULTS.hidden)
    p.add_argument("--dropout", type=float, default=DEFAULTS.dropout)
    p.add_argument("--lr", type=float, default=DEFAULTS.lr)
    p.add_argument("--weight-decay", type=float, default=DEFAULTS.weight_decay)
    p.add_argument("--edge-fraction", type=float, default=DEFAULTS.edge_fraction)
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=DEFAULTS.device)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads per process (the matrices are small: 1 is fastest)",
    )
    security = p.add_argument_group("encryption and differential privacy (on by default)")
    security.add_argument(
        "--no-he",
        dest="encryption",
        action="store_const",
        const="none",
        default="ckks",
        help="send plaintext float32 shares instead of CKKS ciphertexts",
    )
    security.add_argument(
        "--no-dp",
        dest="dp",
        action="store_false",
        help="no clipping, no noise, no privacy guarantee",
    )
    security.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help=f"epsilon target (default {DEFAULTS.epsilon} unless --noise-multiplier is given)",
    )
    security.add_argument("--delta", type=float, default=DEFAULTS.delta)
    security.add_argument(
        "--noise-multiplier",
        type=float,
        default=None,
        help="z: noise std of the aggregate / sensitivity (default: "
        "calibrated from --epsilon over every pass)",
    )
    security.add_argument(
        "--clip", type=float, default=DEFAULTS.clip, help="C: L2 bound of every released row"
    )
    security.add_argument("--accountant", choices=["rdp", "prv"], default=DEFAULTS.accountant)
    security.add_argument(
        "--release-width",
        type=int,
        default=DEFAULTS.release_width,
        help="columns of the noisy layer-1 release",
    )
    security.add_argument(
        "--occurrence-cap",
        type=int,
        default=DEFAULTS.occurrence_cap,
        help="c: times a node may be drawn as a neighbour per layer, up to the release",
    )
    security.add_argument(
        "--no-shared-noise",
        dest="shared_noise",
        action="store_false",
        help="every client adds the full noise (safe against colluding peers; more noise)",
    )
    security.add_argument(
        "--noise-seed",
        type=int,
        default=None,
        help="fix the DP noise (experiments only: a known seed voids the guarantee)",
    )
    p.add_argument(
        "--transport",
        choices=["http", "inprocess"],
        default="http",
        help="http: the service and one worker process per client on loopback; "
        "inprocess: every client in this process",
    )
    p.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of the history here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    if values["epsilon"] is None and values["noise_multiplier"] is None:
        values["epsilon"] = DEFAULTS.epsilon
    return TrainConfig(**values)


def run(args: argparse.Namespace) -> int:
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    config = config_from_args(args)
    if args.transport == "http" and config.mode != "standalone":
        report = train_http(config, threads=args.threads, progress=not args.quiet)
    else:
        report = train_inprocess(config, progress=not args.quiet)
    finish(report, report_path=args.report, plot_path=args.plot)
    return 0


def train_http(config: TrainConfig, *, threads: int, progress: bool) -> RunReport:
    from clients.cli.local_federation import train_over_http

    dataset = load_dataset(
        config.dataset, data_dir=config.data_dir, split=config.split, seed=config.seed
    )
    plan = layout_federation(config, dataset)
    return train_over_http(config, plan, dataset, threads=threads, progress=progress)


def finish(report: RunReport, *, report_path: Path | None, plot_path: Path | None) -> None:
    if report_path:
        report.write(report_path)
    if plot_path:
        plot_history(report, plot_path)
    print(summary(report))


def summary(report: RunReport) -> str:
    cfg = report.config
    lines = [
        f"{cfg['dataset']} ({cfg['split']} split), mode {cfg['mode']}, {cfg['backbone']}, "
        f"M={cfg['clients']}, rounds {report.rounds}",
        f"test accuracy {report.test_accuracy:.4f} (best validation {report.val_accuracy:.4f} "
        f"at round {report.best_round}; final test {report.final_test_accuracy:.4f})",
        f"wall time {report.wall_seconds:.1f} s, bytes up {report.bytes_up:,}, "
        f"down {report.bytes_down:,}",
    ]
    if report.privacy:
        from clients.cli.budget_cmd import describe

        lines.append("privacy budget:\n" + describe(report.privacy))
    elif cfg["mode"] in ("centralized", "standalone"):
        lines.append("privacy: nothing leaves a client in this mode")
    else:
        lines.append("privacy: none (differential privacy off: no (epsilon, delta) guarantee)")
    if report.stopped_early:
        lines.append(f"stopped early: {report.stopped_early}")
    return "\n".join(lines)
