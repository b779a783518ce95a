"""``glasu ask``: the answering party asks its online scoring session for the predictions of a
few of its own ids (clients/online.py), each request signed with its key (``--signing-key``,
clients/request_signing.py), and prints them, in the asked order, as CSV.

Exit codes: 0 answered, 1 an id not among this party's aligned nodes (named; nothing asked) or
no answer in time, 3 the service refused the request (a node the session does not cover, a
closed session), 6 a party refused the request at join (its owner's caps, or a request it cannot
verify as this party's: nothing released)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from clients.cli.connection import add_server_arguments, read_token
from clients.cli.errors import EXIT_POLICY, EXIT_REFUSED, CliError, failing_as
from clients.cli.options import add_command


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "ask",
        help="ask an online scoring session for the predictions of a few ids",
        description="The answering party (the label holder) asks its online scoring session "
        "(`glasu session create --score-with ... --online`) to score a few of its own ids: "
        "each request is one scoring pass, a release counted in every owner's ledger before "
        "anything leaves, signed with --signing-key so that the workers answer only what it "
        "asked. The answer is the one its own `glasu worker --online --predictions "
        'DIR` writes into DIR; it is printed as CSV in the order of --ids (docs/data.md, "Online '
        'scoring").',
    )
    add_server_arguments(p)
    p.add_argument("--session", required=True, metavar="ID", help="the online session (required)")
    for flag, metavar, text in (
        ("--token-file", "PATH", "the answering party's client token of the online session"),
        ("--data", "DIR", "this party's prepared and aligned folder: its ids to aligned nodes"),
        ("--predictions", "DIR", "the folder its online worker writes answers to (its own"
         " --predictions)"),
    ):  # fmt: skip
        p.add_argument(flag, type=Path, required=True, metavar=metavar, help=text + " (required)")
    p.add_argument(
        "--signing-key",
        type=Path,
        metavar="PATH",
        help="this organisation's signing key (alignment-signing.key of `glasu align keygen`): "
        "the request is signed with it, and the workers whose owners pinned its public key "
        "(--answering-party-key) answer only requests it signed",
    )
    p.add_argument("--ids", nargs="+", required=True, metavar="ID", help="own ids to score")
    p.add_argument(
        "--wait-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="how long to wait for the answer",
    )
    return p


def run(args: argparse.Namespace) -> int:
    from clients.admin import tls_verification
    from clients.online import RequestFailed, UnknownIds, aligned_nodes_of, ask
    from clients.request_signing import sign_request
    from clients.service_http import ConnectionOptions, ServiceError
    from clients.session_client import SessionClient
    from secure.protocol import answering_party

    token = read_token(args.token_file, flag="--token-file")
    signing_key = None
    if args.signing_key is not None:
        from nacl.signing import SigningKey

        from clients.cli.keyfiles import read_key_bytes

        signing_key = SigningKey(
            read_key_bytes(args.signing_key, "--signing-key", made_by="glasu align keygen")
        )
    with failing_as("--ca-file"):
        verify = tls_verification(args.ca_file)
    try:
        with failing_as(f"cannot read the party folder {args.data}", ValueError, OSError):
            nodes = aligned_nodes_of(args.data, args.ids)
    except UnknownIds as exc:
        raise CliError(str(exc)) from exc
    service = SessionClient(
        base_url=args.server,
        session_id=args.session,
        client_index=0,  # replaced below by the answering party's index
        token=token,
        options=ConnectionOptions(verify=verify),
    )
    with service:
        try:
            service.client_index = answering_party(service.session().config.label_holder)
            signature = None if signing_key is None else sign_request(
                signing_key, online_id=args.session, party=service.client_index, nodes=nodes,
                now=time.time(),
            )  # fmt: skip
            answer = ask(
                service, nodes, args.ids, predictions=args.predictions,
                wait_seconds=args.wait_seconds, sleep=time.sleep, signature=signature,
            )  # fmt: skip
        except (RequestFailed, ServiceError) as exc:
            # refused by the service (exit 3), or by a party at join (its owner's policy: 6)
            by_service = isinstance(exc, ServiceError)
            print(f"glasu ask: {exc.describe() if by_service else exc}", file=sys.stderr)
            return EXIT_REFUSED if by_service else EXIT_POLICY
        except TimeoutError as exc:
            raise CliError(str(exc)) from exc
    import pyarrow.csv as pa_csv

    pa_csv.write_csv(answer.table, sys.stdout.buffer)
    print(f"glasu ask: answered by {answer.request_session}", file=sys.stderr)
    return 0
