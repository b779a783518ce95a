"""``glasu session``: the operator's side of a deployment. Create a session on a running service
from a dataset (writing the client tokens to hand out), show its status, close it."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import httpx

from clients.cli.train_cmd import DEFAULTS, config_from_args
from clients.transport import tls_verification

TIMEOUT_SECONDS = 60.0


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "session",
        help="create, inspect or close a session on a running service (admin)",
        description="Talk to a running `glasu serve` with the admin token.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create",
        help="create a session from a dataset and write the client tokens",
        description="Build the session (training/evaluation node ids, aggregation layers) from "
        "the dataset exactly as `glasu train` does, POST it, and write OUT/session.json, "
        "OUT/session.id and OUT/client-<m>.token (mode 0600; give each organisation its own).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _connection_arguments(create)
    create.add_argument("--dataset", choices=["cora", "citeseer", "pubmed"], default="cora")
    create.add_argument("--data-dir", type=Path, default=None, help="dataset root")
    create.add_argument("--split", choices=["paper", "public"], default=DEFAULTS.split)
    create.add_argument("--clients", type=int, default=DEFAULTS.clients, help="M")
    create.add_argument("--rounds", type=int, default=DEFAULTS.rounds, help="T")
    create.add_argument("--layers", type=int, default=DEFAULTS.layers, help="L")
    create.add_argument("--agg-layers", type=int, default=DEFAULTS.agg_layers, help="K")
    create.add_argument("--stale", type=int, default=DEFAULTS.stale, help="Q")
    create.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size)
    create.add_argument("--fanout", type=int, default=DEFAULTS.fanout)
    create.add_argument("--hidden", type=int, default=DEFAULTS.hidden)
    create.add_argument("--eval-every", type=int, default=DEFAULTS.eval_every)
    create.add_argument("--seed", type=int, default=DEFAULTS.seed)
    create.add_argument(
        "--no-he",
        dest="encryption",
        action="store_const",
        const="none",
        default="ckks",
        help="plaintext float32 shares (no CKKS encryption)",
    )
    # Differential privacy is not offered here yet: the session's privacy is null.
    create.set_defaults(dp=False, epsilon=None, noise_multiplier=None)
    create.add_argument("--label", default=None, help="free text shown in the status")
    create.add_argument("--out", type=Path, required=True, help="output directory")
    for name, text in (("status", "show a session's progress"), ("close", "close a session")):
        action = actions.add_parser(name, help=text, description=text + " (admin token).")
        _connection_arguments(action)
        action.add_argument("--session", required=True, help="session id")
        if name == "status":
            action.add_argument("--json", action="store_true", help="print the raw JSON")


def _connection_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", required=True, help="base URL of the service")
    p.add_argument("--admin-token-file", type=Path, required=True, help="file with the token")
    p.add_argument("--ca-file", type=Path, default=None, help="CA of the service's certificate")


def run(args: argparse.Namespace) -> int:
    token = args.admin_token_file.read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"the admin token file {args.admin_token_file} is empty")
    with httpx.Client(
        base_url=args.server.rstrip("/"),
        headers={"Authorization": f"Bearer {token}"},
        verify=tls_verification(args.ca_file),
        timeout=TIMEOUT_SECONDS,
    ) as admin:
        if args.action == "create":
            return _create(admin, args)
        response = _call(admin, "GET" if args.action == "status" else "DELETE", args.session)
        body = response.json()
        print(json.dumps(body, indent=2) if args.action == "close" or args.json else describe(body))
    return 0


def _call(admin: httpx.Client, method: str, session: str, **kwargs: Any) -> httpx.Response:
    path = f"/v1/sessions/{session}" if session else "/v1/sessions"
    try:
        response = admin.request(method, path, **kwargs)
    except httpx.TransportError as exc:
        raise RuntimeError(f"cannot reach {admin.base_url}: {type(exc).__name__}: {exc}") from None
    if response.status_code >= 300:
        raise RuntimeError(f"{method} {path} -> {response.status_code}: {response.text}")
    return response


def _create(admin: httpx.Client, args: argparse.Namespace) -> int:
    from clients.cli.local_federation import session_request
    from models.data import load_dataset
    from models.layout import layout_federation

    config = config_from_args(args)
    dataset = load_dataset(
        config.dataset, data_dir=config.data_dir, split=config.split, seed=config.seed
    )
    plan = layout_federation(config, dataset)
    body = session_request(config, plan, dataset)
    body["label"] = args.label or f"glasu session create {config.dataset}"
    args.out.mkdir(parents=True, exist_ok=True)
    created = _call(admin, "POST", "", json=body).json()
    for m, client_token in enumerate(created["client_tokens"]):
        _write_private(args.out / f"client-{m}.token", client_token)
    summary = {
        "session_id": created["session_id"],
        "passes_total": created["passes_total"],
        "server": args.server,
        "clients": body["clients"],
        "encryption": body["encryption"],
        "noise_multiplier": created.get("noise_multiplier"),
        "label": body["label"],
    }
    (args.out / "session.id").write_text(created["session_id"])  # no newline: a ConfigMap value
    (args.out / "session.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"session {created['session_id']}: {created['passes_total']} passes, "
        f"{body['clients']} clients, encryption {body['encryption']}; "
        f"tokens in {args.out}/client-<m>.token"
    )
    return 0


def _write_private(path: Path, content: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(content + "\n")


def describe(status: dict[str, Any]) -> str:
    """A few lines for people: state, pass, and who the current step is waiting for."""
    lines = [
        f"session {status['session_id']} ({status.get('label') or 'no label'}): "
        f"{status['state']}, pass {status['current_pass']} of {status['passes_total']}"
    ]
    progress = status.get("progress")
    if progress:
        lines[0] += f" ({progress['kind']}, round {progress['round']})"
        step = _current_step(progress["layers"], status["config"]["clients"])
        if step:
            lines.append(f"  current step: {step}")
    privacy = status.get("privacy") or {}
    if privacy.get("enabled"):
        lines.append(
            f"privacy: epsilon {privacy['epsilon']:.4g}, delta {privacy['delta']:.3g} "
            f"after {privacy['releases']} release(s)"
        )
    else:
        lines.append("privacy: differential privacy off")
    return "\n".join(lines)


def _current_step(layers: list[dict[str, Any]], clients: int) -> str | None:
    """The first unfinished step in protocol order (docs/protocol.md): node sets top-down for
    the aggregation layers below L, then embeddings bottom-up."""
    steps = [
        ("node sets", layer, layer["union_ready"], layer["nodes_received"])
        for layer in sorted(layers, key=lambda x: -x["layer"])
        if layer["nodes_received"] is not None
    ] + [
        ("embeddings", layer, layer["aggregated"], layer["embeddings_received"])
        for layer in sorted(layers, key=lambda x: x["layer"])
    ]
    for what, layer, done, received in steps:
        if not done:
            missing = sorted(set(range(clients)) - set(received))
            return f"layer {layer['layer']} {what} from {sorted(received)}, missing {missing}"
    return None
