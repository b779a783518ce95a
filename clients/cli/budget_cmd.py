"""``glasu budget``: print a session's privacy budget for people."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import httpx

from clients.transport import tls_verification


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "budget",
        help="show a session's privacy budget",
        description="Read GET /v1/sessions/{id}/privacy with the admin token or a client token.",
    )
    p.add_argument("--server", required=True, help="base URL of the service")
    p.add_argument("--session", required=True, help="session id")
    p.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="file with the admin or a client token (default: $GLASU_ADMIN_TOKEN)",
    )
    p.add_argument("--ca-file", type=Path, default=None, help="CA of the service's certificate")
    p.add_argument("--json", action="store_true", help="print the raw JSON")


def run(args: argparse.Namespace) -> int:
    if args.token_file:
        token = args.token_file.read_text(encoding="utf-8").strip()
    else:
        token = os.environ.get("GLASU_ADMIN_TOKEN", "")
    if not token:
        raise ValueError("give --token-file or set GLASU_ADMIN_TOKEN")
    response = httpx.get(
        f"{args.server.rstrip('/')}/v1/sessions/{args.session}/privacy",
        headers={"Authorization": f"Bearer {token}"},
        verify=tls_verification(args.ca_file),
        timeout=30,
    )
    if response.status_code != 200:
        raise RuntimeError(f"the service answered {response.status_code}: {response.text}")
    report = response.json()
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
