"""``glasu report``: this organisation's privacy report, from its own ledgers, for a compliance
officer to read, check and file (one signed, self-contained HTML or JSON file); ``glasu report
verify`` checks one; ``glasu report keygen`` writes the owner's report key pair."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from clients.cli.errors import CliError, UsageError
from clients.cli.options import (
    add_actions,
    add_command,
    add_output_dir_argument,
    check_output_file,
    ledger_in,
)
from clients.cli.settings_args import FieldFlag, add_field_arguments
from clients.policy import PrivacyPolicy
from clients.settings import WorkerSettings

SIGNING_KEY_FILE = "report-signing.key"  # the Ed25519 seed, hex (keep it)
PUBLIC_KEY_FILE = "report-signing.pub"  # its public key, hex (give it to whoever checks)
FORMATS = ("html", "json")
EXIT_NOT_GENUINE = 1


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "report",
        help="this organisation's signed privacy report, from its own ledgers",
        description="Write one self-contained, signed file (HTML, or JSON) from the privacy "
        "ledgers of this organisation (every flow on its data writes them): with whom and when "
        "its data was used, what was released, the epsilon spent per session and in total "
        "against each adversary, in plain words, the budget left under the caps, and what is "
        "not protected. "
        "`glasu report verify FILE` checks that a report was not altered; `glasu report keygen "
        "--out DIR` writes the key pair that signs them.",
    )
    p.add_argument(
        "--local",
        type=Path,
        nargs="+",
        default=None,
        metavar="DIR",
        help="data folders: the report covers their organisations' privacy ledgers (each "
        "ledger once, however many copies of the data name it)",
    )
    p.add_argument(
        "--ledger",
        type=Path,
        nargs="+",
        default=None,
        metavar="PATH",
        help="privacy ledgers (a worker's --ledger) the report covers, besides --local's",
    )
    p.add_argument("--out", type=Path, default=None, metavar="FILE", help="the report file")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="html (default, or from --out's suffix) or json",
    )
    p.add_argument(
        "--signing-key",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"the owner's report key ({SIGNING_KEY_FILE} of `glasu report keygen`)",
    )
    p.add_argument("--title", default=None, help="the report's heading")
    p.add_argument(
        "--result",
        type=Path,
        action="append",
        default=None,
        metavar="FILE",
        help="a worker's --result file: its session's accuracy, where the ledger has none",
    )
    policy = p.add_argument_group("the owner's policy (the worker's settings of the same name)")
    add_field_arguments(
        policy,
        WorkerSettings,
        {
            "max_session_epsilon": FieldFlag(),
            "max_lifetime_epsilon": FieldFlag(
                help="the most epsilon all sessions together may spend of this data"
            ),
            "policy_delta": FieldFlag(help="the delta at which epsilon is stated"),
            "policy_accountant": FieldFlag(help="the accountant that composes the ledger"),
        },
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    actions = add_actions(p, title="other actions", required=False)
    verify = add_command(
        actions,
        "verify",
        help="check that a report was not altered, and by which key it was signed",
        description="Exit 0 and name the key's fingerprint if the report (HTML or JSON) is as "
        "signed; exit 1 with one sentence otherwise.",
    )
    verify.add_argument("report", type=Path, metavar="FILE", help="the report")
    verify.add_argument(
        "--key",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"the owner's public key ({PUBLIC_KEY_FILE}): also require it signed the report",
    )
    keygen = add_command(
        actions,
        "keygen",
        help="write the owner's report signing key pair",
        description=f"Write DIR/{SIGNING_KEY_FILE} (mode 0600, keep it) and DIR/{PUBLIC_KEY_FILE}"
        " (give it to whoever checks the reports).",
    )
    add_output_dir_argument(keygen, "the folder")
    return p


def check(args: argparse.Namespace) -> None:
    if args.action is not None:
        if args.action == "keygen" and (args.out / SIGNING_KEY_FILE).exists():
            raise UsageError(f"--out {args.out} already holds a report key; keep it or move it")
        return
    if not args.local and not args.ledger:
        raise UsageError(
            "give --local DIR [DIR ...] (data folders whose organisations' ledgers to report) "
            "or --ledger PATH [PATH ...]"
        )
    if args.out is None:
        raise UsageError("give --out FILE (the report)")
    if args.signing_key is None:
        raise UsageError(
            "give --signing-key FILE: a report is signed (`glasu report keygen --out DIR` "
            "writes the key pair)"
        )
    check_output_file(args.out, "--out", overwrite=args.overwrite)


def run(args: argparse.Namespace) -> int:
    if args.action == "verify":
        return _verify(args)
    if args.action == "keygen":
        from clients.cli.keyfiles import write_key_pair

        signing, public = write_key_pair(args.out, SIGNING_KEY_FILE, PUBLIC_KEY_FILE)
        print(
            f"report key in {signing} (keep it); give {public} to whoever checks the reports "
            "(`glasu report verify FILE --key PUB`)"
        )
        return 0
    return _write(args)


def _write(args: argparse.Namespace) -> int:
    from nacl.signing import SigningKey

    from clients.cli.keyfiles import read_key_bytes
    from clients.owner_ledger import OwnerLedger
    from clients.privacy_report import organisation_content
    from clients.report_signing import fingerprint, signed_html, signed_json

    key = SigningKey(
        read_key_bytes(args.signing_key, "--signing-key", made_by="glasu report keygen")
    )
    paths = [ledger_in(folder) for folder in args.local or ()]
    paths += [ledger_in(None, ledger=path) for path in args.ledger or ()]
    snapshots = []
    for path in dict.fromkeys(path.resolve() for path in paths):  # each ledger once
        with OwnerLedger(path) as ledger:
            snapshots.append(ledger.snapshot())
    try:
        policy = PrivacyPolicy(
            max_session_epsilon=args.max_session_epsilon,
            max_lifetime_epsilon=args.max_lifetime_epsilon,
            delta=args.policy_delta,
            accountant=args.policy_accountant,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    content = organisation_content(
        snapshots,
        policy=policy,
        generated_at=time.time(),
        title=args.title,
        accuracies=_accuracies(args.result or []),
    )
    form = args.format or ("json" if args.out.suffix.lower() == ".json" else "html")
    text = signed_json(content, key) if form == "json" else signed_html(content, key)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(text.encode("utf-8"))
    total = content["total"]
    print(
        f"{args.out}: {len(content['sessions'])} session(s), {total['releases']} release(s), "
        f"epsilon {total['epsilon']:.4g} at delta {policy.delta:g}; signed by key "
        f"{fingerprint(key.verify_key)}"
    )
    return 0


def _accuracies(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """By session id: the last evaluation's accuracy in each worker ``--result`` file."""
    found: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot read --result {path}: {exc}") from None
        history = [h for h in summary.get("history", []) if h.get("test_accuracy") is not None]
        if summary.get("session_id") and history:
            found[summary["session_id"]] = {
                "federated": history[-1]["test_accuracy"],
                "alone": history[-1].get("reference_test_accuracy"),
            }
    return found


def _verify(args: argparse.Namespace) -> int:
    from nacl.signing import VerifyKey

    from clients.cli.keyfiles import read_key_bytes
    from clients.report_signing import ReportNotGenuine, verify_report

    expected = None
    if args.key is not None:
        expected = VerifyKey(read_key_bytes(args.key, "--key", made_by="glasu report keygen"))
    try:
        text = args.report.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {args.report}: {exc}") from None
    try:
        signer = verify_report(text, expected=expected)
    except ReportNotGenuine as exc:
        print(f"{args.report}: NOT valid: {exc}.")
        return EXIT_NOT_GENUINE
    print(f"{args.report}: valid, signed by key {signer}")
    return 0
