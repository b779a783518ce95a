"""``glasu align run``: one organisation's side of an alignment (``clients/cli/align_cmd.py``
parses it): a fresh one, kept where it was created with ``--keep``, or an update of the kept one
where it names a base (docs/data.md, "The kept alignment"); the outcome is written into its
prepared folder."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.connection import read_token
from clients.cli.errors import EXIT_PEERS_MISSING, CliError, failing_as
from clients.cli.keyfiles import read_key_bytes

OUTCOME_FIELDS = (
    "alignment_id",
    "party",
    "parties",
    "digest",
    "rows",
    "seed",
    "nodes",
    "aligned_nodes",
)

if TYPE_CHECKING:
    from clients.alignment import AlignmentClient, AlignmentOutcome
    from clients.alignment_signing import SetSigning


def _key_bytes(path: Path, flag: str) -> bytes:
    return read_key_bytes(path, flag, made_by="glasu align keygen")


def _signing(args: argparse.Namespace) -> SetSigning:
    from nacl.signing import SigningKey, VerifyKey

    from clients.alignment_signing import SetSigning

    own = args.signing_key
    return SetSigning(
        signing_key=None if own is None else SigningKey(_key_bytes(own, "--signing-key")),
        peer_keys={m: VerifyKey(_key_bytes(path, "--peer-key")) for m, path in args.peer_key or []},
    )


def run_party(args: argparse.Namespace) -> int:
    """``glasu align run``: this organisation's side, its outcome written into its folder."""
    from clients.alignment import AlignmentClient, AlignmentFailed
    from clients.alignment_keeping import deployed_kept_location, write_kept
    from clients.service_http import ConnectionOptions, PeersMissing, tls_verification
    from models.data.party import NO_LABEL, read_party, write_alignment
    from models.data.shared_split import deployed_alignment

    token = read_token(args.token_file, flag="--token-file")
    signing = _signing(args)
    with failing_as(f"cannot read --data {args.data}"):
        data = read_party(args.data)
    with failing_as("--ca-file"):
        verify = tls_verification(args.ca_file)
    kept_path = args.kept or deployed_kept_location(args.data, args.server, args.party)
    with AlignmentClient(
        base_url=args.server,
        alignment_id=args.alignment,
        party=args.party,
        token=token,
        options=ConnectionOptions(verify=verify, peer_wait_seconds=args.peer_wait_seconds),
    ) as client:
        try:
            outcome = _take_part(client, args, data.ids, signing, kept_path)
        except AlignmentFailed as exc:
            raise CliError(f"the alignment failed: {exc}") from exc
        except PeersMissing as exc:
            print(f"glasu align run: {exc}", file=sys.stderr)
            return EXIT_PEERS_MISSING
    if outcome.kept is not None:
        with failing_as(f"cannot write the kept alignment {kept_path}"):
            write_kept(outcome.kept, kept_path)
        print(
            f"kept in {kept_path} ({outcome.kept.blinded_last} blindings here; update "
            f"{outcome.kept.updates} of its keys)"
        )
    # the folder's alignment is the outcome's fields of the same names
    alignment = deployed_alignment(**{name: getattr(outcome, name) for name in OUTCOME_FIELDS})
    with failing_as(f"cannot write the alignment into {args.data}"):
        write_alignment(alignment, args.data)
    unlabelled = int((data.labels[outcome.rows >= 0] == NO_LABEL).sum())
    if outcome.nodes == "union":
        coverage = (
            f"its {data.num_rows} nodes are among the {outcome.aligned_nodes} nodes of the "
            f"union, {outcome.shared_nodes} of them held by all {outcome.parties} parties"
        )
    else:
        coverage = (
            f"{outcome.aligned_nodes} of its {data.num_rows} nodes are shared by all "
            f"{outcome.parties} parties"
        )
    print(f"{args.data}: {coverage} (digest {outcome.digest[:16]}...); {alignment.split_note}")
    if unlabelled:
        print(
            f"glasu align run: warning: {unlabelled} of its aligned nodes have no label here; "
            "the worker needs a label for every aligned node it holds (docs/data.md)",
            file=sys.stderr,
        )
    return 0


def _take_part(
    client: AlignmentClient,
    args: argparse.Namespace,
    ids: Sequence[str],
    signing: SetSigning,
    kept_path: Path,
) -> AlignmentOutcome:
    """A fresh alignment, kept where it was created with --keep, or an update of the kept one
    where it names a base: refused before anything is posted where the kept file does not fit."""
    from clients.alignment import align
    from clients.alignment_keeping import read_kept
    from clients.alignment_update import update_alignment

    status = client.status()
    options = {"signing": signing, "progress": not args.quiet, "workers": args.workers}
    if status.base is None:
        if status.keep and kept_path.exists() and not args.realign:
            raise CliError(
                f"{kept_path} holds this organisation's kept alignment, and alignment "
                f"{args.alignment} is a fresh one (new keys): give --realign to replace it, or "
                "ask the operator for an update of it (glasu align create --base)"
            )
        return align(client, ids, keep=status.keep, **options)
    with failing_as("the kept alignment"):
        kept = read_kept(kept_path, parties=status.parties, party=args.party)
    if kept is None:
        raise CliError(
            f"alignment {args.alignment} updates alignment {status.base}, and no kept alignment "
            f"is at {kept_path} (--kept): this organisation takes part in a fresh one instead"
        )
    due = kept.rotation_due(time.time())
    if due is not None:
        raise CliError(
            f"{kept_path}: {due}: its keys rotate, so ask the operator for a fresh alignment "
            "(glasu align create --keep) and take part with --realign"
        )
    return update_alignment(client, ids, kept, **options)
