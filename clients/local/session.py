"""What ``glasu train`` asks of the service and of each worker: the session request and the
workers' command lines (their model options and their privacy policy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from models.config import TrainConfig
from models.data import GraphDataset
from models.layout import FederationLayout, eval_nodes


def session_request(
    config: TrainConfig, layout: FederationLayout, dataset: GraphDataset
) -> dict[str, Any]:
    """The ``POST /v1/sessions`` body for ``config``."""
    width = config.release_width if config.private else config.hidden
    return {
        "clients": len(layout.partitions),
        "layers": config.layers,
        "agg_layers": [
            {"layer": layer, "width": width} for layer in layout.client_config.agg_layers
        ],
        "stale": layout.client_config.stale,
        "rounds": config.rounds,
        "eval_every": config.eval_every,
        "batch_size": config.batch_size,
        "fanout": config.fanout,
        "num_nodes": dataset.num_nodes,
        "train_nodes": dataset.train_nodes.tolist(),
        "eval_nodes": eval_nodes(dataset).tolist(),
        "seed": config.seed,
        "encryption": "ckks" if config.encrypted else "none",
        "privacy": config.privacy_request(),
        "label": f"glasu train {config.dataset} {config.mode}",
    }


def worker_arguments(
    config: TrainConfig,
    *,
    server: str,
    session_id: str,
    client: int,
    token_file: Path,
    data: Path,
    result: Path,
    secret_context: Path | None,
    threads: int,
    passes_total: int,
) -> list[str]:
    """``glasu worker`` arguments for one client of ``config``. Its privacy policy is the run's
    own: the user owns every client's data here, so each worker allows what the run asks for."""
    args = [
        "worker",
        "--server", server,
        "--session", session_id,
        "--client", str(client),
        "--token-file", str(token_file),
        "--data", str(data),
        "--device", config.device,
        "--backbone", config.backbone,
        "--hidden", str(config.hidden),
        "--dropout", str(config.dropout),
        "--lr", str(config.lr),
        "--weight-decay", str(config.weight_decay),
        "--eval-fanout", str(config.eval_fanout),
        "--seed", str(config.seed),
        "--threads", str(threads),
        "--result", str(result),
        "--quiet",
    ]  # fmt: skip
    if secret_context is not None:
        args += ["--secret-context", str(secret_context)]
    if config.noise_seed is not None:
        args += ["--noise-seed", str(config.noise_seed)]
    privacy = config.session_privacy(clients=config.clients, passes_total=passes_total)
    if privacy is None:
        return [*args, "--no-require-dp"]
    # the worker states its spend at the run's delta with the run's accountant: the same numbers
    budget = privacy.epsilon if privacy.epsilon is not None else privacy.epsilon_planned
    budget = repr(budget * (1 + 1e-9))  # recomputed in another process: allow the last bit
    args += [
        "--max-session-epsilon", budget,
        "--max-lifetime-epsilon", budget,
        "--policy-delta", repr(config.delta),
        "--policy-accountant", config.accountant,
    ]  # fmt: skip
    if privacy.shared_noise:
        args.append("--allow-shared-noise")
    return args
