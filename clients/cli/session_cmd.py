"""``glasu session``: the operator's side of a deployment. Create a session on a running service
from a dataset or an alignment (writing the client tokens to hand out), or a scoring session
with a training's models; list the sessions, show one's status, close it."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from clients.cli import train_config, train_options
from clients.cli.connection import add_admin_arguments, admin_client, read_token
from clients.cli.errors import CliError, UsageError, failing_as
from clients.cli.options import (
    add_actions,
    add_command,
    add_output_dir_argument,
    check_output_dir,
    given_options,
    non_negative_int,
    positive_float,
    write_private_file,
)

if TYPE_CHECKING:
    from clients.admin import AdminClient
    from models.config import TrainConfig


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "session",
        help="create, inspect or close a session on a running service (admin)",
        description="Talk to a running `glasu serve` with the admin token.",
    )
    actions = add_actions(p)
    create = add_command(
        actions,
        "create",
        help="create a session from a dataset and write the client tokens",
        description="Build the session (training/evaluation node ids, aggregation layers) from "
        "the dataset exactly as `glasu train` does, POST it, and write OUT/session.json, "
        "OUT/session.id and OUT/client-<m>.token (mode 0600; give each organisation its own). "
        "Differential privacy is on by default (epsilon 4 over the whole session); each "
        "organisation's worker checks it against its own privacy policy before it sends anything.",
    )
    add_admin_arguments(create)
    train_options.add_data_arguments(create)
    create.add_argument(
        "--alignment",
        default=None,
        metavar="ID",
        help="the organisations' own data: an alignment every party has run `glasu align run` "
        "for; its shared nodes and split replace --dataset (docs/data.md)",
    )
    create.add_argument(
        "--score-with",
        default=None,
        metavar="SESSION",
        help="create a scoring session instead: the organisations' workers score with the "
        "models they kept from training session SESSION (`glasu worker --model DIR "
        "--predictions FILE`), over every node of --alignment, or the evaluation nodes of "
        "--dataset; the model, noise and seed are that session's (the training options below "
        "are ignored)",
    )
    create.add_argument(
        "--share-predictions",
        choices=["none", "label-holder"],
        default=None,
        help="with --score-with: what the label holder's partners receive. The label holder's "
        "prediction is the model's answer (without a label holder, party 0's); 'none' "
        "(default): nothing; 'label-holder': its predictions, through the service, encrypted "
        "like every share (its worker takes part only if its owner agreed: glasu worker "
        "--share-predictions)",
    )
    create.add_argument(
        "--online",
        action="store_true",
        help="with --score-with: an online scoring session, open until closed: the workers "
        "(`glasu worker --online`) keep their models loaded, and the answering party asks for "
        "a few of its ids at a time (`glasu ask`); each request is one scoring pass over them "
        '(docs/data.md, "Online scoring")',
    )
    train_options.add_setting(
        create,
        "--backbone",
        "the backbone the workers run, stored with the session (a worker given another refuses "
        "it). The recipe (README, 'The recipe chooses itself') chooses it when not given, and "
        "the settings not given for it; this command prints what it chose",
        choices=train_options.BACKBONES,
    )
    for flag, what, kind, metavar in (
        ("--hops", "hops of the sign backbone's propagation", non_negative_int, "K"),
        ("--lr", "learning rate", positive_float, "RATE"),
    ):
        train_options.add_setting(
            create,
            flag,
            f"{what}: each worker's own setting, which the session carries as its workers' "
            "default when given or chosen by the recipe (a worker given its own keeps it)",
            type=kind,
            metavar=metavar,
        )
    train_options.add_federation_arguments(create, local=False)
    train_options.add_encryption_argument(create)
    train_options.add_privacy_arguments(create, noise_seed=False)
    create.add_argument(
        "--label",
        default=None,
        help="free text shown in the status and in each organisation's privacy report",
    )
    train_options.add_session_about_arguments(create)
    add_output_dir_argument(create)
    for name, text in (("status", "show a session's progress"), ("close", "close a session")):
        action = add_command(actions, name, help=text, description=text + " (admin token).")
        add_admin_arguments(action)
        action.add_argument("--session", required=True, metavar="ID", help="session id (required)")
        action.add_argument("--json", action="store_true", help="print the raw JSON")
    listing = add_command(
        actions,
        "list",
        help="list the service's sessions",
        description="Every session of the service, oldest first, one line each (admin token).",
    )
    add_admin_arguments(listing)
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    return p


def check(args: argparse.Namespace) -> None:
    if args.action == "create":
        if args.share_predictions is not None and args.score_with is None:
            raise UsageError("--share-predictions is a scoring session's: give --score-with")
        if args.online and args.score_with is None:
            raise UsageError("--online is a scoring session's: give --score-with")
        train_config.check_federation(args, through_service=True)
        check_output_dir(args.out, "--out")


def run(args: argparse.Namespace) -> int:
    token = read_token(args.admin_token_file, flag="--admin-token-file")
    with admin_client(args, token) as admin:
        if args.action == "create":
            return _create(admin, args)
        if args.action == "list":
            for summary in admin.sessions():
                print(json.dumps(summary) if args.json else describe_listed(summary))
        elif args.action == "status":
            body = admin.session(args.session)
            print(json.dumps(body, indent=2) if args.json else describe(body))
        else:
            body = admin.close_session(args.session)
            print(json.dumps(body, indent=2) if args.json else describe_closed(body))
    return 0


def _training_body(admin: AdminClient, args: argparse.Namespace, config: TrainConfig) -> dict:
    from clients.local.session import aligned_session_request, session_request
    from models.layout import layout_federation

    if not config.dp:
        print(
            "glasu session create: WARNING: differential privacy is OFF for this session: the "
            "organisations' workers refuse it unless their owners pass --no-require-dp, and "
            "nothing bounds what the shares reveal to the other parties",
            file=sys.stderr,
        )
    if args.alignment is not None:
        # the labels are the parties' own: which training nodes carry one is unknown here
        config, defaults = session_recipe(config, args, labelled=None)
        with failing_as(f"cannot use alignment {args.alignment}", ValueError):
            body = aligned_session_request(config, admin.alignment(args.alignment))
        body["label"] = args.label or f"glasu session create --alignment {args.alignment}"
    else:
        dataset = train_options.load_benchmark(config)
        # the session's training nodes are the dataset's labelled ones, as in glasu train
        config, defaults = session_recipe(config, args, labelled=len(dataset.train_nodes) or None)
        with failing_as(f"the options do not fit {config.dataset}", ValueError):
            layout = layout_federation(config, dataset)
        body = session_request(config, layout, dataset)
        body["label"] = args.label or f"glasu session create {config.dataset}"
    if defaults:
        body["worker_defaults"] = defaults
    return body


def session_recipe(
    config: TrainConfig, args: argparse.Namespace, *, labelled: int | None
) -> tuple[TrainConfig, dict[str, Any]]:
    """``config`` with the recipe's choices for the settings not given, printed as ``glasu
    train`` prints them, and the choices of settings that are each worker's own (the learning
    rate, say), which the session carries as its workers' defaults (``worker_defaults``): said
    after the block."""
    chosen = train_config.with_recipe(config, args, labelled=labelled)
    defaults = workers_own_choices(config, chosen, given=given_options(args))
    if defaults:
        flags = ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in defaults.items())
        print(
            f"the session's defaults for its workers' own settings: {flags} (a worker given "
            "its own keeps it)",
            flush=True,
        )
    return chosen, defaults


def workers_own_choices(
    config: TrainConfig, chosen: TrainConfig, *, given: set[str]
) -> dict[str, Any]:
    """The settings that are each worker's own and that a session may set its workers'
    defaults for (``clients.session_fit.session_defaultable``) which the command line gave
    (``given``: ``--lr``) or ``chosen`` changes."""
    from clients.session_fit import session_defaultable

    return {
        name: getattr(chosen, name)
        for name in sorted(session_defaultable())
        if "--" + name.replace("_", "-") in given or getattr(chosen, name) != getattr(config, name)
    }


def _scoring_body(admin: AdminClient, args: argparse.Namespace, config: TrainConfig) -> dict:
    """A scoring session with the models of ``--score-with``: every aligned node, or the
    dataset's evaluation nodes."""
    import numpy as np

    from clients.local.session import scoring_request

    training = admin.session(args.score_with)["config"]
    if training.get("kind", "training") not in ("training", "release"):
        raise CliError(f"--score-with {args.score_with} is not a training session")
    if args.alignment is not None:
        alignment = admin.alignment(args.alignment)
        nodes = np.arange(int(alignment["aligned_nodes"]))
        training = {**training, "num_nodes": int(alignment["aligned_nodes"])}
    else:
        from models.layout import eval_nodes

        nodes = eval_nodes(train_options.load_benchmark(config))
    body = scoring_request(
        training,
        model_session=args.score_with,
        nodes=nodes,
        share_predictions=args.share_predictions or "none",
    )
    body["label"] = args.label or body["label"]
    body["online"] = args.online
    return body


def _create(admin: AdminClient, args: argparse.Namespace) -> int:
    config = train_config.config_from_args(args)
    if args.score_with is not None:
        body = _scoring_body(admin, args, config)
    else:
        body = _training_body(admin, args, config)
    body.update(train_options.session_about(args))
    body["ready_gate"] = True  # no worker releases into a session another one refused
    with failing_as(f"cannot create --out {args.out}"):
        args.out.mkdir(parents=True, exist_ok=True)
    created = admin.create_session(body)
    for m, client_token in enumerate(created["client_tokens"]):
        write_private_file(args.out / f"client-{m}.token", client_token)
    summary = {
        "session_id": created["session_id"],
        "passes_total": created["passes_total"],
        "server": args.server,
        "clients": body["clients"],
        "encryption": body["encryption"],
        "noise_multiplier": created.get("noise_multiplier"),
        "privacy": body["privacy"],
        "label": body["label"],
        **({"backbone": body["backbone"]} if "backbone" in body else {}),
        **train_options.session_about(args),
    }
    (args.out / "session.id").write_text(created["session_id"])  # no newline: a ConfigMap value
    (args.out / "session.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"session {created['session_id']}: {created['passes_total']} passes, "
        f"{body['clients']} clients"
        + (f", backbone {body['backbone']}" if "backbone" in body else "")
        + f", encryption {body['encryption']}, "
        + _privacy_words(body["privacy"], created.get("noise_multiplier"))
        + f"; tokens in {args.out}/client-<m>.token"
    )
    return 0


def _privacy_words(privacy: dict[str, Any] | None, noise_multiplier: float | None) -> str:
    if not privacy or noise_multiplier is None:
        return "differential privacy OFF"
    target = privacy.get("epsilon")
    budget = f", epsilon target {target:g}" if target is not None else ", no epsilon target"
    return f"differential privacy (z {noise_multiplier:.4g}{budget})"


def describe(status: dict[str, Any]) -> str:
    """A few lines for people: state, pass, and who the current step is waiting for."""
    lines = [
        f"session {status['session_id']} ({status.get('label') or 'no label'}): "
        f"{status['state']}, pass {status['current_pass']} of {status['passes_total']}"
    ]
    progress = status.get("progress")
    if progress:
        lines[0] += f" ({progress['kind']}, round {progress['round']})"
        absent = progress.get("absent") or []
        step = _current_step(progress["layers"], status["config"]["clients"], absent)
        if step:
            lines.append(f"  current step: {step}")
        if absent:
            lines.append(
                f"  going on without clients {absent} (left out of an earlier pass; they rejoin "
                "when their workers are back)"
            )
    join = _join_line(status.get("readiness"))
    if join:
        lines.append(join)
    privacy = status.get("privacy") or {}
    if privacy.get("enabled"):
        lines.append(
            f"privacy: epsilon {privacy['epsilon']:.4g}, delta {privacy['delta']:.3g} "
            f"after {privacy['releases']} release(s)"
        )
    else:
        lines.append("privacy: differential privacy off")
    return "\n".join(lines)


def _join_line(readiness: list[dict[str, Any]] | None) -> str | None:
    """The join gate: who said ready, who refused and why, who has not said yet."""
    if not readiness:
        return None
    if all(answer["state"] == "ready" for answer in readiness):
        return "  join: every client said ready"
    said = [
        f"client {answer['client']} {answer['state']}"
        + (f" ({answer['reason']})" if answer.get("reason") else "")
        for answer in readiness
    ]
    return "  join: " + ", ".join(said)


def describe_listed(summary: dict[str, Any]) -> str:
    """One line of ``glasu session list``."""
    created = datetime.fromtimestamp(summary["created_at"], tz=UTC).isoformat(timespec="seconds")
    return (
        f"{summary['session_id']}  {summary['state']:<17} pass {summary['current_pass']} of "
        f"{summary['passes_total']}, {summary['clients']} clients, created {created}  "
        f"{summary.get('label') or '(no label)'}"
    )


def describe_closed(summary: dict[str, Any]) -> str:
    """``DELETE /v1/sessions/{id}``'s answer in the words of :func:`describe`."""
    return (
        f"session {summary['session_id']} ({summary.get('label') or 'no label'}): "
        f"{summary['state']}, pass {summary['current_pass']} of {summary['passes_total']}; "
        "its workers stop at their next call"
    )


def _current_step(layers: list[dict[str, Any]], clients: int, absent: list[int]) -> str | None:
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
            missing = sorted(set(range(clients)) - set(received) - set(absent))
            return f"layer {layer['layer']} {what} from {sorted(received)}, missing {missing}"
    return None
