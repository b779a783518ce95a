"""``glasu align``: the private entity alignment of a deployed federation (docs/data.md).

``glasu align create`` (the operator, admin token) opens an alignment and writes one token per
party; each organisation runs ``glasu align run`` on its prepared folder (its ids never leave its
machine: only blinded values do) and gets its rows' places in the shared node index, with the
train/validation/test split, written into the folder; the operator then creates the training
session with ``glasu session create --alignment ID`` and each organisation runs
``glasu worker --data DIR``. ``glasu align status`` shows the progress. ``glasu align keygen``
writes an organisation's Ed25519 key pair: with ``--signing-key`` and its peers' public keys
(``--peer-key``), a party signs its sets and blinds only sets its peer signed, so that the
service cannot have it blind guessed ids (docs/threat-model.md). An alignment created with
``--keep`` is kept (the service keeps its fully blinded sets, each party its key and map); one
created with ``--base ID`` updates it: each party moves only the ids it added or removed since
(docs/data.md, "The kept alignment")."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import get_args

from clients.cli.connection import (
    add_admin_arguments,
    add_server_arguments,
    admin_client,
    read_token,
)
from clients.cli.errors import UsageError, failing_as
from clients.cli.keyfiles import write_key_pair
from clients.cli.options import (
    add_actions,
    add_command,
    add_output_dir_argument,
    check_output_dir,
    int_range,
    non_negative_int,
    positive_int,
    write_private_file,
)
from secure.protocol import AlignedNodes
from secure.wire.alignment import MAX_SEED
from secure.wire.common import MAX_CLIENTS

SIGNING_KEY_FILE = "alignment-signing.key"  # the Ed25519 seed, hex
PUBLIC_KEY_FILE = "alignment-signing.pub"  # its public key, hex


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "align",
        help="align the organisations' node ids privately (deployed federations)",
        description="A private set intersection through the service: the organisations learn "
        "which of their node ids they all share, and nothing else about each other's ids.",
    )
    actions = add_actions(p)
    create = add_command(
        actions,
        "create",
        help="open an alignment and write the party tokens (admin)",
        description="POST /v1/alignments; writes OUT/alignment.id and OUT/party-<m>.token (mode "
        "0600: give each organisation its own).",
    )
    add_admin_arguments(create)
    create.add_argument(
        "--parties",
        type=int_range(2, MAX_CLIENTS),
        required=True,
        metavar="M",
        help="number of organisations (required)",
    )
    create.add_argument(
        "--seed",
        type=int_range(0, MAX_SEED),
        default=0,
        help="seeds the train/validation/test split over the shared nodes",
    )
    create.add_argument(
        "--nodes",
        choices=get_args(AlignedNodes),
        default="intersection",
        help="index the ids every party holds (intersection), or every id any party holds "
        "(union: partly shared nodes, trained with the count-aware mean; docs/data.md)",
    )
    create.add_argument(
        "--keep",
        action="store_true",
        help="keep the alignment (the service its fully blinded sets, each party its key and "
        "map), so that the next one can be an update of it (--base); intersection only",
    )
    create.add_argument(
        "--base",
        metavar="ID",
        help="an update of kept alignment ID (the last of its chain): each party moves only the "
        "ids added or removed since; kept in turn",
    )
    create.add_argument("--label", default=None, help="free text shown in the status")
    add_output_dir_argument(create)
    run_ = add_command(
        actions,
        "run",
        help="take part in an alignment with this organisation's prepared folder",
        description="Blind this organisation's node ids, take its turns in the ring, and write "
        "where each of its nodes sits in the shared node index (and the split) into DIR.",
    )
    _party_arguments(run_)
    run_.add_argument(
        "--data",
        type=Path,
        required=True,
        metavar="DIR",
        help="this organisation's folder from `glasu prepare` (required)",
    )
    run_.add_argument(
        "--peer-wait-seconds",
        type=non_negative_int,
        default=900,
        metavar="S",
        help="how long to wait for the other parties at one step before giving up (exit 5)",
    )
    run_.add_argument(
        "--insecure-http",
        action="store_true",
        help="allow a plain-HTTP service address other than loopback (off by default)",
    )
    run_.add_argument(
        "--signing-key",
        type=Path,
        metavar="PATH",
        help="this organisation's key from `glasu align keygen`: sign every set it posts",
    )
    run_.add_argument(
        "--peer-key",
        type=_peer_key,
        action="append",
        metavar="M=PATH",
        help="party M's public key (its alignment-signing.pub, received out of band); "
        "repeat for every other party: then only sets signed by their poster are blinded",
    )
    run_.add_argument(
        "--workers",
        type=_workers,
        default=None,
        metavar="N",
        help="processes that blind the ids (libsodium's scalar multiplications): auto (the "
        "default: the cores available) or a number",
    )
    run_.add_argument(
        "--kept",
        type=Path,
        metavar="PATH",
        help="this organisation's kept alignment: written by an alignment created with --keep, "
        "read and updated by one created with --base (default: with the organisation's ledger, "
        "or DIR/alignment.kept)",
    )
    run_.add_argument(
        "--realign",
        action="store_true",
        help="let an alignment created with --keep (new keys) replace the kept one",
    )
    run_.add_argument("--quiet", action="store_true", help="no progress bar")
    keygen = add_command(
        actions,
        "keygen",
        help="write this organisation's signing key pair for `align run`",
        description=f"Writes DIR/{SIGNING_KEY_FILE} (secret, mode 0600) and "
        f"DIR/{PUBLIC_KEY_FILE} (give it to the other organisations out of band).",
    )
    add_output_dir_argument(keygen)
    status = add_command(
        actions,
        "status",
        help="show an alignment's progress",
        description="The admin token or a party token.",
    )
    _party_arguments(status, party=False)
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    return p


def _party_arguments(p: argparse.ArgumentParser, *, party: bool = True) -> None:
    add_server_arguments(p)
    p.add_argument("--alignment", required=True, metavar="ID", help="alignment id (required)")
    if party:
        p.add_argument(
            "--party",
            type=int_range(0, MAX_CLIENTS - 1),
            required=True,
            metavar="M",
            help="this organisation's party index (required)",
        )
    p.add_argument(
        "--token-file",
        type=Path,
        required=True,
        metavar="PATH",
        help=("file with this party's token" if party else "file with a party or the admin token")
        + " (required)",
    )


def _workers(text: str) -> int | None:
    """``auto`` (None: the cores available) or a positive number."""
    if text == "auto":
        return None
    return positive_int(text)


def _peer_key(text: str) -> tuple[int, Path]:
    party, equals, path = text.partition("=")
    if not equals or not party.isdigit() or not path:
        raise argparse.ArgumentTypeError(f"give M=PATH (a party and its public key), not {text!r}")
    return int(party), Path(path)


def check(args: argparse.Namespace) -> None:
    if args.action in ("create", "keygen"):
        check_output_dir(args.out, "--out")
    if args.action == "keygen" and (args.out / SIGNING_KEY_FILE).exists():
        raise UsageError(f"--out {args.out} already holds a signing key; keep it or move it")
    if args.action == "run":
        parties = [m for m, _ in args.peer_key or []]
        if args.party in parties or len(set(parties)) != len(parties):
            raise UsageError(
                "--peer-key: one per other party (this is party "
                f"{args.party}), got parties {parties}"
            )
        from clients.settings import plain_http_off_loopback

        if plain_http_off_loopback(args.server) and not args.insecure_http:
            raise UsageError(
                f"--server {args.server} is plain HTTP on a network address: use https:// "
                "(with --ca-file), or pass --insecure-http"
            )
        if not args.data.is_dir():
            raise UsageError(f"--data {args.data} is not a directory (a folder of glasu prepare)")


def run(args: argparse.Namespace) -> int:
    if args.action == "create":
        return _create(args)
    if args.action == "keygen":
        return _keygen(args.out)
    if args.action == "status":
        token = read_token(args.token_file, flag="--token-file")
        with admin_client(args, token) as reader:
            body = reader.alignment(args.alignment)
        print(json.dumps(body, indent=2) if args.json else describe(body))
        return 0
    from clients.cli.align_run import run_party

    return run_party(args)


def _create(args: argparse.Namespace) -> int:
    token = read_token(args.admin_token_file, flag="--admin-token-file")
    with admin_client(args, token) as admin:
        created = admin.create_alignment(
            {
                "parties": args.parties,
                "seed": args.seed,
                "nodes": args.nodes,
                "label": args.label,
                "keep": args.keep,
                "base": args.base,
            }
        )
    with failing_as(f"cannot write --out {args.out}"):
        args.out.mkdir(parents=True, exist_ok=True)
        for m, party_token in enumerate(created["party_tokens"]):
            write_private_file(args.out / f"party-{m}.token", party_token)
        (args.out / "alignment.id").write_text(created["alignment_id"])
    print(
        f"alignment {created['alignment_id']}: {args.parties} parties, split seed {args.seed}; "
        f"tokens in {args.out}/party-<m>.token"
    )
    return 0


def _keygen(out: Path) -> int:
    signing, public = write_key_pair(out, SIGNING_KEY_FILE, PUBLIC_KEY_FILE)
    print(
        f"signing key in {signing} (keep it); give {public} to "
        "the other organisations (`glasu align run --peer-key M=PATH`)"
    )
    return 0


def describe(status: dict) -> str:
    sets = ", ".join(
        f"party {s['owner']}: {s['size'] if s['size'] is not None else '?'} ids, "
        f"{s['hops']}/{status['parties']} blindings"
        for s in status["sets"]
    )
    line = f"alignment {status['alignment_id']} ({status.get('label') or 'no label'}"
    if status.get("base"):
        line += f"; an update of {status['base']}"
    elif status.get("keep"):
        line += "; kept"
    line += "): "
    line += f"{status['state']}; {sets}"
    if status["state"] == "done" and status.get("nodes") == "union":
        line += (
            f"; {status['aligned_nodes']} nodes in the union, {status['shared_nodes']} shared "
            f"by all, digest {status['digest']}"
        )
    elif status["state"] == "done":
        line += f"; {status['aligned_nodes']} shared nodes, digest {status['digest']}"
    return line
