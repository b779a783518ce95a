"""``glasu budget``: print a session's privacy budget for people."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from clients.cli.connection import add_server_arguments, admin_client, read_token
from clients.cli.options import add_command


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "budget",
        help="show a session's privacy budget",
        description="Show a session's (epsilon, delta): spent, target and mechanism "
        "(GET /v1/sessions/{id}/privacy, with the admin token or a client token).",
    )
    add_server_arguments(p)
    p.add_argument("--session", required=True, metavar="ID", help="session id (required)")
    p.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="file with the admin token or a client token (default: $GLASU_ADMIN_TOKEN)",
    )
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    return p


def run(args: argparse.Namespace) -> int:
    token = read_token(args.token_file, env="GLASU_ADMIN_TOKEN", flag="--token-file")
    with admin_client(args, token) as admin:
        report = admin.privacy(args.session)
    print(json.dumps(report, indent=2) if args.json else describe(report))
    return 0


def describe(report: dict) -> str:
    if not report.get("enabled"):
        return "differential privacy is OFF for this session: no (epsilon, delta) guarantee"
    target = report.get("epsilon_target")
    lines = [
        f"spent:   epsilon = {report['epsilon']:.4g}, delta = {report['delta']:.3g} "
        f"after {report['releases']} release(s) ({report['accountant']} accountant)",
        f"target:  epsilon <= {target:.4g}" if target is not None else "target:  none set",
        f"planned: epsilon = {report['epsilon_planned']:.4g} after every pass of the session"
        if report.get("epsilon_planned") is not None
        else "",
        f"mechanism: Gaussian, noise multiplier z = {report['noise_multiplier']:.4g} "
        f"({report.get('noise_multiplier_source')}), sensitivity = {report['sensitivity']:.4g}, "
        f"clip C = {report['clip']:.4g}",
    ]
    return "\n".join(line for line in lines if line)
