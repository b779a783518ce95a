"""``glasu budget``: a session's privacy budget (from the service), or what an organisation has
spent of its data across sessions (``--local DIR``: the worker's own ledger), for people."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from clients.cli.connection import add_server_arguments, admin_client, read_token
from clients.cli.errors import UsageError
from clients.cli.options import add_command, ledger_in
from clients.cli.settings_args import FieldFlag, add_field_arguments
from clients.settings import WorkerSettings
from secure.accounting import composed_epsilon


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "budget",
        help="show a session's privacy budget, or this organisation's own ledger",
        description="Show a session's (epsilon, delta): spent, target, mechanism and against "
        "whom it holds (GET /v1/sessions/{id}/privacy, with the admin token or a client token). "
        "With --local DIR (or --ledger PATH): what this organisation has released of its data, "
        "across all sessions and flows (its own ledger; no service needed).",
    )
    p.add_argument(
        "--local",
        type=Path,
        default=None,
        metavar="DIR",
        help="a data folder: print its organisation's privacy ledger instead (the one the "
        "workers on DIR write: $XDG_DATA_HOME/glasu/ledgers/<organisation>.sqlite3 for a "
        "folder of glasu prepare)",
    )
    p.add_argument(
        "--ledger",
        type=Path,
        default=None,
        metavar="PATH",
        help="print this privacy ledger (a worker's --ledger) instead",
    )
    add_server_arguments(p, required=False)
    p.add_argument("--session", default=None, metavar="ID", help="session id (with --server)")
    add_field_arguments(  # the worker's policy settings, under names of their own here
        p,
        WorkerSettings,
        {
            "policy_delta": FieldFlag(
                "--delta", "with --local: the delta at which to state epsilon (use your policy's)"
            ),
            "policy_accountant": FieldFlag("--accountant", "with --local: the accountant"),
        },
    )
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
    if args.local is not None or args.ledger is not None:
        return _local(args)
    if args.server is None or args.session is None:
        raise UsageError(
            "give --server and --session (a session's budget), or --local DIR or --ledger PATH"
        )
    token = read_token(args.token_file, env="GLASU_ADMIN_TOKEN", flag="--token-file")
    with admin_client(args, token) as admin:
        report = admin.privacy(args.session)
    print(json.dumps(report, indent=2) if args.json else describe(report))
    return 0


def _local(args: argparse.Namespace) -> int:
    from clients.owner_ledger import OwnerLedger
    from secure.report import iso_utc

    path = ledger_in(args.local, ledger=args.ledger)
    with OwnerLedger(path) as ledger:
        # One read: a worker writing meanwhile must not make a session's figure count rows the
        # lifetime figure does not (a session above the lifetime spend of the same releases).
        sessions = ledger.sessions()
        records = ledger.snapshot().sessions

    def epsilon(inverse_square_sum: float) -> float:
        return composed_epsilon(
            inverse_square_sum=inverse_square_sum, delta=args.delta, accountant=args.accountant
        )

    total = epsilon(sum(s.inverse_square_sum for s in sessions))
    rows = [
        {
            "session": s.session_id,
            "label": records.get(s.session_id, {}).get("label"),
            "releases": s.releases,
            # answers sent to the partners as its owner agreed: no epsilon, counted apart
            "predictions_shared": records.get(s.session_id, {}).get("predictions_shared", 0),
            "epsilon": epsilon(s.inverse_square_sum),
            "last_release_at": s.last_at,
            "last_release_at_utc": iso_utc(s.last_at),
        }
        for s in sessions
    ]
    # a scoring of a kept private sign model: recorded, nothing released (its training's release)
    released = {s.session_id for s in sessions}
    rows += [
        {
            "session": session_id,
            "label": record.get("label"),
            "releases": 0,
            "predictions_shared": record.get("predictions_shared", 0),
            "epsilon": 0.0,
            "last_release_at": None,
            "last_release_at_utc": None,
            "post_processes": record["post_processes"],
        }
        for session_id, record in records.items()
        if record.get("post_processes") and session_id not in released
    ]
    summary = {
        "ledger": str(path),
        "delta": args.delta,
        "accountant": args.accountant,
        "releases": sum(s.releases for s in sessions),
        "epsilon": total,
        "predictions_shared": sum(row["predictions_shared"] for row in rows),
        "sessions": rows,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"{path}: {summary['releases']} release(s) of this data in {len(rows)} session(s);\n"
        f"lifetime spend: epsilon = {total:.4g} at delta = {args.delta:g} ({args.accountant}; "
        f"sessions compose exactly as Gaussian releases)"
        + (
            f";\n{summary['predictions_shared']} prediction(s) shared with the partners (as its "
            "owner agreed; not a noisy release, no epsilon)"
            if summary["predictions_shared"]
            else ""
        )
    )
    for row in rows:
        label = f" ({row['label']})" if row["label"] else ""
        when = (
            f"post-processing of session {row['post_processes']}'s release"
            if "post_processes" in row
            else f"last at {row['last_release_at_utc']}"
        )
        print(
            f"  {row['session']}{label}: {row['releases']} release(s), epsilon = "
            f"{row['epsilon']:.4g}, {when}"
            + (
                f", {row['predictions_shared']} prediction(s) shared"
                if row["predictions_shared"]
                else ""
            )
        )
    return 0


def describe(report: dict) -> str:
    """A privacy report for people: what was spent, against whom, and what is not protected."""
    if not report.get("enabled"):
        return "differential privacy is OFF for this session: no (epsilon, delta) guarantee"
    target = report.get("epsilon_target")
    z, ledger_z = report["noise_multiplier"], report["ledger_noise_multiplier"]
    if abs(z - ledger_z) <= 1e-12 * z:
        noise = f"noise multiplier z = {z:.4g} ({report.get('noise_multiplier_source')})"
    else:
        noise = (
            f"noise multiplier of the sum z = {z:.4g} ({report.get('noise_multiplier_source')}); "
            f"the ledger composes z = {ledger_z:.4g}, what one curious peer faces after "
            "removing its own share (shared noise)"
        )
    lines = [
        f"spent:   epsilon = {report['epsilon']:.4g}, delta = {report['delta']:.3g} "
        f"after {report['releases']} release(s) ({report['accountant']} accountant)",
        f"target:  epsilon <= {target:.4g}" if target is not None else "target:  none set",
        f"planned: epsilon = {report['epsilon_planned']:.4g} after every pass of the session"
        if report.get("epsilon_planned") is not None
        else "",
        f"mechanism: {_mechanism_name(report)}, {noise}, sensitivity ="
        f" {report['sensitivity']:.4g}, clip C = {report['clip']:.4g}"
        + (
            f", degree-normalised release (degree floor {report['degree_floor']})"
            if report.get("degree_floor")
            else ""
        ),
    ]
    if "NOT PRIVATE" in report.get("noise", ""):
        lines.insert(0, f"WARNING: the noise was {report['noise']}")
    if report.get("privacy_unit"):
        lines.append(f"protects: {report['privacy_unit']}")
        lines.append("against:")
        for adversary in report.get("adversaries", []):
            if adversary["epsilon"] is None:
                value = "nothing to account (" + adversary["note"] + ")"
            else:
                value = (
                    f"epsilon = {adversary['epsilon']:.4g} "
                    f"(planned {adversary['epsilon_planned']:.4g}; z = "
                    f"{adversary['noise_multiplier']:.4g}: {adversary['note']})"
                )
            lines.append(f"  {adversary['adversary']}: {value}")
        lines.extend(report.get("adversary_lines", []))
        lines.append("not protected: " + "; ".join(report.get("not_protected", [])))
        lines.append("what epsilon means: docs/privacy.md, section 1")
    return "\n".join(line for line in lines if line)


def _mechanism_name(report: dict) -> str:
    if report.get("split_noise"):
        return "discrete Gaussian split between the clients (docs/privacy.md section 11)"
    return "Gaussian"
