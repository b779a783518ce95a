"""Whether this worker fits the session it joins: its local model options, its data and, for a
scoring session, its trained model, checked against the session's settings before anything is
sent (:class:`SessionMismatch`, :class:`models.artefact.ModelError`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, get_args

from models.answer import answer_columns
from models.artefact import ModelError, SavedModel, is_private_sign
from models.backbone import ModelConfig
from models.client_config import ClientConfig
from models.config import DEFAULT_HOPS, BackboneName, TrainConfig, backbone_problem
from models.data.partition import ClientPartition, check_labels, without_labels
from secure.aggregation import EmbeddingCodec
from secure.protocol import answering_party
from secure.wire.sessions import SessionConfigView

PRIVATE_DEFAULT_HIDDEN = 128
#: A worker's backbone in a session that names none: glasu train's default
DEFAULT_BACKBONE: str = TrainConfig.backbone


@dataclass(frozen=True)
class LocalModelOptions:
    """What each organisation chooses for its own part of the model. Only the widths at the
    aggregation layers (the session's) must agree across clients."""

    backbone: str | None = None  # None: the session's (options_for_session), else gcnii
    hops: int = DEFAULT_HOPS  # the sign backbone's propagation
    feature_scale: str = "auto"  # of its propagated columns
    hidden: int | None = None  # default: the aggregation width (plain GLASU) or 128 (private)
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 5e-4
    eval_fanout: int = 10
    seed: int | None = None  # initialisation and dropout; default: the session's seed
    noise_seed: int | None = None  # reproducible DP noise (experiments only)
    cache_rounds: int = 1  # W of the CELU-VFL workset (models/workset.py)
    instance_weighting: bool = False
    weight_threshold: float = 0.5


class SessionMismatch(ValueError):
    """This worker's data or settings cannot take part in the session: found when it joins,
    before it sends anything."""


def session_defaultable() -> frozenset[str]:
    """The local options a session may set its workers' defaults for (``worker_defaults``: the
    operator's recipe chose them). Not the backbone (the session's own field), nor the hidden
    width and the seed (the session's already, as the aggregation width and the session seed),
    nor the noise seed (tests only: a service must never fix a worker's noise)."""
    names = {field.name for field in dataclasses.fields(LocalModelOptions)}
    return frozenset(names - {"backbone", "hidden", "seed", "noise_seed"})


def session_backbone(session_config: Mapping[str, Any], own: str | None) -> str:
    """The backbone this worker runs: the session's (the one ``glasu session create`` chose
    its settings for), or ``own`` where the session names none (``DEFAULT_BACKBONE`` unless
    given). A worker given another backbone than the session's would train a model the
    session's settings were not chosen for: :class:`SessionMismatch`."""
    named = session_config.get("backbone")
    if named is not None and named not in get_args(BackboneName):
        raise SessionMismatch(f"the session names backbone {named!r}, which this worker lacks")
    if named is not None and own not in (None, named):
        raise SessionMismatch(
            f"--backbone {own} differs from the session's backbone {named}, for which its "
            "settings (layers, aggregation layers, batch, stale rounds) were chosen: drop this "
            f"worker's --backbone, or ask the operator for a session created with --backbone {own}"
        )
    return own or named or DEFAULT_BACKBONE


def options_for_session(
    session_config: Mapping[str, Any], options: LocalModelOptions, *, given: Collection[str] = ()
) -> LocalModelOptions:
    """``options`` as this worker runs them in the session: its backbone
    (:func:`session_backbone`), and the session's ``worker_defaults`` for the options its owner
    did not give (``given``: flags, variables or settings file), each checked as the worker
    setting of its name is (:class:`SessionMismatch`)."""
    from pydantic import TypeAdapter, ValidationError

    from clients.settings import WorkerSettings

    defaults = session_config.get("worker_defaults") or {}
    taken: dict[str, Any] = {}
    for name, value in defaults.items():
        if name not in session_defaultable():
            raise SessionMismatch(
                f"the session sets a default for {name!r}, which is no setting of this worker "
                "that a session may set"
            )
        field = WorkerSettings.model_fields[name]
        try:
            checked = TypeAdapter(Annotated[field.annotation, *field.metadata]).validate_python(
                value, strict=True
            )
        except ValidationError as exc:
            raise SessionMismatch(
                f"the session's default {name} {value!r} is not a valid --"
                f"{name.replace('_', '-')}: {exc.errors()[0]['msg']}"
            ) from None
        if name not in given:
            taken[name] = checked
    backbone = session_backbone(session_config, options.backbone)
    return dataclasses.replace(options, backbone=backbone, **taken)


def client_config_from_session(
    session_config: Mapping[str, Any], options: LocalModelOptions
) -> ClientConfig:
    """The client's model and training settings: the session's, with this party's ``options``.
    ``session_config`` is the JSON of a session's settings (``SessionConfigView``), as a worker
    got it or as a kept model's manifest records it (an in-process run records fewer fields)."""
    options = dataclasses.replace(
        options, backbone=session_backbone(session_config, options.backbone)
    )
    privacy = session_config.get("privacy")
    # a release session: the private sign design's one release, its training local (or a
    # scoring session of such a model, post-processing of its release)
    one_release = "release" in (session_config.get("kind"), session_config.get("model_kind"))
    problem = backbone_problem(
        options.backbone, private=privacy is not None, one_release=one_release
    )
    if problem is not None:
        raise SessionMismatch(problem)
    widths = {a["width"] for a in session_config["agg_layers"]}
    if privacy is not None:
        hidden = options.hidden or PRIVATE_DEFAULT_HIDDEN
    elif len(widths) != 1:
        raise SessionMismatch(
            f"this worker needs one width at every aggregation layer, got {widths}"
        )
    else:
        hidden = widths.pop()
        if options.hidden not in (None, hidden):
            raise SessionMismatch(
                f"--hidden {options.hidden} differs from the session's aggregation width {hidden}"
            )
    model = ModelConfig(
        backbone=options.backbone,  # type: ignore[arg-type]
        hops=options.hops,
        feature_scale=options.feature_scale,  # type: ignore[arg-type]
        layers=session_config["layers"],
        hidden=hidden,
        dropout=options.dropout,
        # the private arrangement's release is the session's only aggregation layer
        receiver_width=session_config["agg_layers"][0]["width"]
        if privacy and not one_release
        else 0,
    )
    return ClientConfig(
        model=model,
        agg_layers=tuple(a["layer"] for a in session_config["agg_layers"]),
        stale=session_config["stale"],
        cache_rounds=options.cache_rounds,
        instance_weighting=options.instance_weighting,
        weight_threshold=options.weight_threshold,
        fanout=session_config["fanout"],
        eval_fanout=options.eval_fanout,
        occurrence_cap=privacy["occurrence_cap"] if privacy else None,
        count_aware=session_config.get("nodes") == "union",
        label_holder=session_config.get("label_holder"),
        lr=options.lr,
        weight_decay=options.weight_decay,
        seed=session_config["seed"] if options.seed is None else options.seed,
        part_values=session_config.get("part_values"),
        shared_answer_width=shared_answer_width(session_config),
        sampled_eval=session_config.get("scoring_pass") == "sampled",
    )


def shared_answer_width(session_config: Mapping[str, Any]) -> int | None:
    """A scoring session that shares the answering party's predictions: the width of its
    answer layer (the top aggregation layer's, as the service plans it); else None."""
    if session_config.get("share_predictions", "none") == "none":
        return None
    return int(session_config["agg_layers"][-1]["width"])


def session_partition(partition: ClientPartition, config: SessionConfigView) -> ClientPartition:
    """The partition as the session uses it: a passive party of a label holder's session keeps
    no label and no split (GLASU B.2); every other client of a training session needs its
    labels (a scoring session needs none)."""
    if partition.held is not None and config.nodes != "union":
        raise SessionMismatch(
            f"this party lacks {int((~partition.held).sum())} of the {partition.num_nodes} "
            "aligned nodes (an alignment over the union), but the session averages over the "
            "intersection: create the session from the alignment (nodes 'union')"
        )
    holder = config.label_holder
    if holder is not None and holder != partition.client:
        return without_labels(partition)
    if config.kind == "scoring":
        # the ids it scores are new customers, without labels: those it has only add metrics
        return partition
    remedy = (
        "otherwise the operator names the one party with labels when creating the session "
        "(glasu session create --label-holder M; docs/data.md)"
        if holder is None
        else f"the session names this party (client {holder}) the label holder "
        "(--label-holder): give it its labels (glasu prepare --labels) or name another holder"
    )
    try:
        check_labels(partition, where="this worker's data", remedy=remedy)
    except ValueError as exc:
        raise SessionMismatch(str(exc)) from None
    return partition


def options_of_model(model: SavedModel, options: LocalModelOptions) -> LocalModelOptions:
    """The local settings that rebuild ``model``'s network (whatever the worker's flags say)."""
    saved = model.manifest["model"]
    return dataclasses.replace(
        options,
        backbone=saved["backbone"],
        hops=saved.get("hops", DEFAULT_HOPS),  # a model of before the sign backbone has none
        feature_scale=saved.get("feature_scale") or "auto",  # its statistics are its weights'
        hidden=saved["hidden"],
        dropout=saved["dropout"],
        eval_fanout=saved["eval_fanout"],
        seed=saved["seed"],
    )


def check_model_fits(
    model: SavedModel, config: SessionConfigView, partition: ClientPartition
) -> None:
    """A scoring session scores with the model it names, built as it was trained, on data of
    the model's feature schema: :class:`ModelError` naming what differs."""
    saved = model.manifest["model"]
    if config.model_session not in (None, model.manifest["session_id"]):
        raise ModelError(
            f"the scoring session uses the models of session {config.model_session}, but "
            f"{model.path} was trained in session {model.manifest['session_id']}"
        )
    expected = {
        "layers": config.layers,
        "agg_layers": [a.layer for a in config.agg_layers],
        "widths": [a.width for a in config.agg_layers],
        "session_seed": config.seed,
    }
    for name, value in expected.items():
        if saved.get(name) != value:
            raise ModelError(
                f"the scoring session has {name} {value}, the model {model.path} was trained "
                f"with {saved.get(name)}: create the scoring session from the model's manifest"
            )
    check_model_kind(model, config)
    release = model.manifest.get("release")
    privacy = config.privacy
    if (release is None) != (privacy is None):
        raise ModelError(
            f"the model {model.path} was trained "
            + ("without" if release is None else "with")
            + " differential privacy and the scoring session is "
            + ("private" if privacy else "not")
            + ": score with the privacy the model was trained with"
        )
    if (
        release is not None
        and privacy is not None
        and (privacy.noise_multiplier, privacy.clip)
        != (release["noise_multiplier"], release["clip"])
    ):
        raise ModelError(
            f"the scoring session's noise (z {privacy.noise_multiplier}, clip "
            f"{privacy.clip}) differs from the training's (z {release['noise_multiplier']},"
            f" clip {release['clip']}): the model reads the others' release at that noise level"
        )
    width = None if config.share_predictions == "none" else config.agg_layers[-1].width
    classes = int(saved["num_classes"])
    if (
        width is not None
        and partition.client == answering_party(config.label_holder)
        and answer_columns(classes) > width
    ):
        raise ModelError(
            f"the session shares this party's predictions in {width} columns, its model's "
            f"{classes} classes need {answer_columns(classes)}"
        )
    if model.manifest["party"]["index"] != partition.client:
        raise ModelError(
            f"{model.path} is party {model.manifest['party']['index']}'s model, this worker is "
            f"client {partition.client}"
        )
    if partition.feature_names is not None:
        model.check_features(partition.feature_names)
    elif int(partition.features.shape[1]) != saved["in_features"]:
        raise ModelError(
            f"the data has {int(partition.features.shape[1])} feature columns, the model "
            f"{model.path} {saved['in_features']}"
        )


def check_model_kind(model: SavedModel, config: SessionConfigView) -> None:
    """A private sign model scores by post-processing of its kept release, in a session that
    says so (``model_kind`` 'release', which the service plans without a release), and only
    there: :class:`ModelError` otherwise, whatever else the session says."""
    kept_release = is_private_sign(model.manifest)
    if kept_release != (config.model_kind == "release"):
        raise ModelError(
            f"the scoring session's model_kind is {config.model_kind!r}, but {model.path} is "
            + ("" if kept_release else "not ")
            + "a private sign model (scored by post-processing of its kept release, model_kind "
            "'release'): create the scoring session from the model's manifest"
        )


def fit_to_session(
    partition: ClientPartition,
    config: SessionConfigView,
    *,
    client: int,
    codec: EmbeddingCodec,
    model: SavedModel | None,
) -> ClientPartition:
    """The partition as the session uses it, once this worker (``client``), its data, its codec
    and, for a scoring session, its model fit the session (:class:`SessionMismatch`,
    :class:`ModelError`)."""
    if partition.client != client:
        raise SessionMismatch(
            f"the partition is client {partition.client}'s, but this worker is client {client}"
        )
    if partition.clients != config.clients or partition.num_nodes != config.num_nodes:
        raise SessionMismatch(
            f"the partition (M={partition.clients}, {partition.num_nodes} nodes) does not "
            f"match the session (M={config.clients}, {config.num_nodes} nodes)"
        )
    if codec.encoding != config.encoding:
        raise SessionMismatch(
            f"the session expects {config.encoding} shares, this worker's codec "
            f"makes {codec.encoding}: give the secret context (or --no-he) to match; a masked "
            "session (bfv-masked) needs the BFV --secret-context, --masking-key and "
            "--masking-peer-keys"
        )
    partition = session_partition(partition, config)
    if config.kind == "scoring":
        if model is None:
            raise ModelError("a scoring session needs this party's trained model (--model DIR)")
        check_model_fits(model, config, partition)
    return partition


def check_answer_reaches(config: SessionConfigView, *, client: int) -> None:
    """A worker asked to write predictions (``--predictions``) writes the model's answer: its
    own where it is the answering party, else the one a scoring session shares with it;
    :class:`SessionMismatch` where it would have none."""
    if config.kind != "scoring":
        raise SessionMismatch(
            "predictions come from a scoring session (glasu session create --score-with)"
        )
    answering = answering_party(config.label_holder)
    if client != answering and config.share_predictions == "none":
        raise SessionMismatch(
            f"the model's answer is party {answering}'s (the label holder's) and this scoring "
            "session shares it with no partner (share_predictions none): this party has no "
            "predictions to write; run it without --predictions, or ask the operator for a "
            "session with --share-predictions label-holder"
        )
