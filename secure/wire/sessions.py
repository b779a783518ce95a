"""The bodies of the session routes: what the operator asks for (``POST /v1/sessions``), what it
gets back, and how a session's settings are shown (docs/api.md)."""

from __future__ import annotations

import itertools
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator

from secure.accounting import AccountantName
from secure.dp import DEFAULT_DEGREE_FLOOR, ReleaseKind
from secure.protocol import (
    PART_VALUES,
    AlignedNodes,
    SecureAggregation,
    ShareEncoding,
    StragglerPolicy,
)
from secure.wire.common import (
    MAX_CLIENTS,
    MAX_COUNT,
    MAX_LAYERS,
    MAX_NODE_ID,
    MAX_ROUNDS,
    MAX_WIDTH,
    Label,
    ResponseModel,
    StrictModel,
)
from secure.wire.node_lists import NodeList
from secure.wire.request_signature import RequestSignature

# the values of service.session_state.SessionState (secure/ never imports service/; a test
# checks that they stay the same)
SessionStateName = Literal["running", "finished", "budget_exhausted", "closed"]
MAX_PART_VALUES = 2**26


class AggLayer(StrictModel):
    layer: int = Field(ge=1, le=MAX_LAYERS, description="1-based index of the GNN layer.")
    width: int = Field(ge=1, le=MAX_WIDTH, description="Columns of the embeddings at this layer.")


class PrivacySettings(StrictModel):
    """Gaussian mechanism at the first aggregation layer (``secure.privacy``). Give
    ``noise_multiplier`` (z), or ``epsilon`` (a target from which z is calibrated for the
    session's releases), or both (then z is used as given and the target caps the ledger). The
    sensitivity is not a setting: the service derives it from ``clip`` and ``occurrence_cap``."""

    noise_multiplier: float | None = Field(
        None, gt=0, le=1e6, description="z: the noise std of the sum is z * sensitivity."
    )
    epsilon: float | None = Field(
        None, ge=1e-6, le=1e6, description="Target epsilon: calibrates z and caps the ledger."
    )
    delta: float = Field(gt=0, lt=1)
    clip: float = Field(gt=0, le=1e9, description="C: per-row L2 clip bound (clients apply it).")
    accountant: AccountantName = "rdp"
    max_releases: int | None = Field(None, ge=1, le=MAX_COUNT, description="Cap on releases.")
    shared_noise: bool = Field(
        False, description="Each client adds variance sigma^2/M so the sum carries sigma^2."
    )
    split_noise: bool = Field(
        False,
        description="Split discrete Gaussian noise (3 clients or more, encrypted, accountant"
        " 'rdp'; docs/privacy.md section 11): each client adds sigma^2/(M-1) on the share grid, so"
        " the sum less any one share carries sigma^2. What masked secure aggregation uses.",
    )
    occurrence_cap: int = Field(
        1,
        ge=0,
        le=MAX_COUNT,
        description="c: how often a node may be drawn as a neighbour per layer up to the release"
        " (the clients' samplers enforce it). The service derives the sensitivity of one release"
        " from clip and c: Delta = 2 C sqrt(c + 1).",
    )
    release: ReleaseKind = Field(
        "clip-after",
        description="How each client's layer-1 release is formed (docs/privacy.md 3.7):"
        " 'clip-after' aggregates over the sender's graph, then clips each row to C;"
        " 'degree-normalised' clips each node's own row to C, sums it over the drawn"
        " neighbourhood and divides by max(degree, degree_floor): Delta = 2 C sqrt(c + 1) /"
        " degree_floor.",
    )
    degree_floor: int = Field(
        DEFAULT_DEGREE_FLOOR,
        ge=1,
        le=MAX_COUNT,
        description="d_min of the degree-normalised release (a fixed setting, never a statistic"
        " of the graph); unused by 'clip-after'.",
    )

    @model_validator(mode="after")
    def _noise_is_determined(self) -> PrivacySettings:
        if self.noise_multiplier is None and self.epsilon is None:
            raise ValueError(
                "give noise_multiplier, or epsilon (a target to calibrate it), or both"
            )
        return self


SessionKind = Literal["training", "scoring", "release"]
#: The kind of session whose models a scoring session uses (``model_kind``)
ModelKind = Literal["training", "release"]
#: What a scoring session's partners of the answering party receive (``share_predictions``)
SharePredictions = Literal["none", "label-holder"]
# models.config.BackboneName's spelling, and a worker setting's name: the service stores them
# and never reads them (the workers check them against their own)
BACKBONE_PATTERN = SETTING_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
#: How a scoring session's pass covers its nodes (``scoring_pass``)
ScoringPass = Literal["all-nodes", "sampled"]
#: A worker setting's value in ``worker_defaults``
WorkerDefault = bool | int | float | Annotated[str, Field(max_length=64)]


def one_node_at_least(nodes: np.ndarray, what: str) -> np.ndarray:
    if not nodes.size:
        raise ValueError(f"{what} one node at least")
    return nodes


class SessionCreate(StrictModel):
    kind: SessionKind = Field(
        "training",
        description="'scoring': no training; the workers load their trained models and score "
        "`eval_nodes` jointly in ONE evaluation pass (a release like a training pass: encrypted, "
        "noised and counted; its shares travel in parts, so no request grows with the nodes). "
        "`rounds`, `eval_every`, `stale` and `train_nodes` are ignored. 'release': the private "
        "sign design (docs/privacy.md 3.8): ONE evaluation pass in which each releasing worker "
        "uploads its released block over every aligned node (`agg_layers`: layer 1, the "
        "block's width), then each worker with labels trains locally for `rounds` rounds, with "
        "no more passes; needs `privacy`.",
    )
    model_session: str | None = Field(
        None,
        max_length=64,
        description="A scoring session: the training session whose models score (each worker "
        "refuses a model from another).",
    )
    model_kind: ModelKind = Field(
        "training",
        description="A scoring session: the kind of the `model_session`. 'release': models of "
        "the private sign design (docs/privacy.md 3.8), whose scoring is post-processing of "
        "each sender's kept release: ONE pass in which each sender uploads its kept block's "
        "rows of the `eval_nodes` (no release, epsilon 0; each worker checks it against its own "
        "model).",
    )
    clients: int = Field(ge=1, le=MAX_CLIENTS, description="M, the number of clients.")
    layers: int = Field(ge=1, le=MAX_LAYERS, description="L, the number of GNN layers.")
    agg_layers: list[AggLayer] = Field(min_length=1, description="Ascending aggregation layers.")
    stale: int = Field(ge=1, le=MAX_COUNT, description="Q, local steps per round (stale).")
    rounds: int = Field(ge=1, le=MAX_ROUNDS, description="T, the number of training rounds.")
    eval_every: int = Field(
        0, ge=0, le=MAX_COUNT, description="Evaluate after every k-th round (0: at the end)."
    )
    batch_size: int = Field(ge=1, le=MAX_COUNT, description="Output nodes per training round.")
    fanout: int = Field(ge=1, le=MAX_COUNT, description="Neighbours sampled per node and layer.")
    num_nodes: int = Field(ge=1, le=MAX_NODE_ID, description="Nodes are 0..num_nodes-1.")
    train_nodes: NodeList = Field(
        default_factory=list,  # validated into an empty array (JSON input takes no array)
        validate_default=True,
        description="The ids the batches come from (a training session needs one at least), "
        'encoded (docs/protocol.md, "Node lists").',
    )
    eval_nodes: NodeList = Field(
        description="The ids of every eval pass (one at least), encoded like `train_nodes`."
    )
    seed: int = Field(ge=0, le=2**63 - 1, description="Seeds the output batches.")
    encryption: Literal["ckks", "none"] = Field(
        "ckks", description="'ckks': the service adds ciphertexts; 'none': float32 plaintext."
    )
    secure_aggregation: SecureAggregation = Field(
        "none",
        description="'masks': each share is masked with pairwise masks that cancel only in the "
        "sum of every client's share and encrypted under BFV (encoding 'bfv-masked', "
        "docs/secure-aggregation.md): the service alone sees ciphertexts, the service with one "
        "worker uniformly masked shares. Needs encryption 'ckks' (the workers then hold the "
        "shared BFV key instead of the CKKS one) and 3 clients or more. Under stragglers "
        "'continue' a pass that loses a client is void and the next is masked over the others "
        "(`participants` of the pass descriptor); split noise then needs stragglers 'wait'.",
    )
    privacy: PrivacySettings | None = None
    nodes: AlignedNodes = Field(
        "intersection",
        description="'union': nodes are partly shared (an alignment over the union). Each share "
        "then carries one more column, the client's presence indicator (1 where it holds the "
        "node, its row zero elsewhere), so the sum's last column counts each row's holders and "
        "the clients divide by it (the count-aware mean).",
    )
    label_holder: int | None = Field(
        None,
        ge=0,
        lt=MAX_CLIENTS,
        description="GLASU Appendix B.2: the one client that holds the labels (null: every "
        "client). Without privacy, the top layer must be an aggregation layer and every training "
        "pass gains an exchange at layer `layers + 1` of the top layer's width: the holder's "
        "gradient for the top-layer aggregate, summed with the others' zero shares.",
    )
    stragglers: StragglerPolicy = Field(
        "wait",
        description="What a pass does when a client is late. 'wait': every pass waits for every"
        " client (a client gives up after its own peer-wait limit and names the missing one)."
        " 'continue' (3 clients or more, unshared noise): once `straggler_wait_seconds` have"
        " passed since a layer's first upload, the layer is aggregated over the clients that"
        " arrived (2 at least; the sum's X-Glasu-Count says how many, the clients divide by it),"
        " the late client is excluded from the rest of that pass (409 `excluded`) and rejoins at"
        " a later one.",
    )
    straggler_wait_seconds: float = Field(
        60.0,
        gt=0,
        le=86400,
        description="With stragglers 'continue': how long a layer waits after its first upload.",
    )
    part_values: int | None = Field(
        None,
        ge=1,
        le=MAX_PART_VALUES,
        description="Values (rows x columns) per part of a share: a layer of r rows and c "
        "columns travels in parts of max(1, part_values // c) rows. Null: the service picks the "
        f"most (up to {PART_VALUES}) whose upload fits its body limit (`max_body_bytes`, in the "
        "session's description), which is what it refuses a given value over.",
    )
    backbone: str | None = Field(
        None,
        pattern=BACKBONE_PATTERN,
        description="The backbone the session's settings were chosen for (`glasu session "
        "create --backbone`, whose recipe chose them): a worker without a backbone of its own "
        "takes it, a worker given another refuses the session. Null: each worker's own (gcnii "
        "unless given).",
    )
    worker_defaults: dict[Annotated[str, Field(pattern=SETTING_PATTERN)], WorkerDefault] | None = (
        Field(
            None,
            max_length=32,
            description="Defaults for settings that are each worker's own (its local model: "
            '`{"hops": 10, "lr": 0.002}`), chosen by the operator\'s recipe (`glasu session '
            "create`): a worker takes each one its owner did not give, checked as that setting "
            "is; one given stays the worker's own.",
        )
    )
    ready_gate: bool = Field(
        False,
        description="Every worker says at join whether it can take part (`PUT .../clients/{m}"
        "/readiness`): no share is accepted before every client said ready, and one client's "
        "refusal closes the session, so that no client releases into a session another refused."
        " `glasu session create` sets it.",
    )
    share_predictions: SharePredictions = Field(
        "none",
        description="A scoring session: what the answering party's partners receive (the "
        "answering party: the label holder, else client 0; its prediction is the model's "
        "answer). 'none': nothing. 'label-holder': its predictions, as a sum through the "
        "service at layer `layers + 1` (the top aggregation layer's width) to which the others "
        "add zeros; its worker sends them only if its owner agreed.",
    )
    scoring_pass: ScoringPass = Field(
        "all-nodes",
        description="A scoring session's pass. 'all-nodes': every aligned node is inferred "
        "layer by layer and each share holds all `num_nodes` rows. 'sampled': only the "
        "`eval_nodes`' sampled neighbourhoods, as a training pass samples them (the session's "
        "`fanout`, the occurrence cap, node sets exchanged at the aggregation layers below the "
        "top), so a pass over a few nodes costs a few rows (an online session's requests).",
    )
    online: bool = Field(
        False,
        description='A scoring session that stays open for requests (docs/data.md, "Online '
        'scoring"): its workers keep their models loaded, and each `POST /v1/sessions/{id}/'
        "requests` of the answering party opens one scoring session over the asked nodes (of "
        "this session's `eval_nodes`), run by the same workers with this session's tokens.",
    )
    request_signature: RequestSignature | None = Field(
        None,
        description="A request session: the answering party's signature of the request, as "
        "asked (`POST .../requests`); the service only keeps and shows it, each online worker "
        "checks it at join.",
    )
    label: Label | None = None
    partners: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None,
        max_length=MAX_CLIENTS,
        description="The organisations taking part, by the names people know them by (each "
        "worker keeps them in its ledger for its owner's privacy report).",
    )
    operator: str | None = Field(
        None, min_length=1, max_length=200, description="Who runs the service and the session."
    )

    @field_validator("agg_layers")
    @classmethod
    def _strictly_ascending(cls, agg_layers: list[AggLayer]) -> list[AggLayer]:
        indices = [a.layer for a in agg_layers]
        if any(b <= a for a, b in itertools.pairwise(indices)):
            raise ValueError(f"agg_layers must be strictly ascending by layer, got {indices}")
        return agg_layers

    @field_validator("train_nodes")
    @classmethod
    def _training_needs_nodes(cls, nodes: np.ndarray, info: ValidationInfo) -> np.ndarray:
        if info.data.get("kind", "training") == "training" and not nodes.size:
            raise ValueError("a training session needs one training node at least")
        return nodes

    @field_validator("eval_nodes")
    @classmethod
    def _evaluation_needs_nodes(cls, nodes: np.ndarray) -> np.ndarray:
        return one_node_at_least(nodes, "eval_nodes needs")

    @model_validator(mode="after")
    def _fits_the_model_and_graph(self) -> SessionCreate:
        if self.agg_layers[-1].layer > self.layers:
            raise ValueError(
                f"aggregation layer {self.agg_layers[-1].layer} is above the top layer"
                f" (layers={self.layers})"
            )
        for name in ("train_nodes", "eval_nodes"):
            nodes = getattr(self, name)  # sorted
            if nodes.size and (nodes[0] < 0 or nodes[-1] >= self.num_nodes):
                raise ValueError(f"{name} must lie in [0, num_nodes={self.num_nodes})")
        if self.label_holder is not None:
            if self.label_holder >= self.clients:
                raise ValueError(
                    f"label_holder {self.label_holder} is not a client (0..{self.clients - 1})"
                )
            if self.privacy is None and self.agg_layers[-1].layer != self.layers:
                raise ValueError(
                    "a single label holder needs the top layer as an aggregation layer "
                    f"(layers={self.layers}), GLASU Appendix B.2"
                )
        if self.nodes == "union" and self.privacy is not None and self.privacy.shared_noise:
            raise ValueError(
                "nodes 'union' needs unshared noise: a party's share is zero where it lacks a"
                " node, so with shared_noise those rows of the sum would carry less noise than"
                " the ledger counts"
            )
        if self.share_predictions != "none" and self.kind != "scoring":
            raise ValueError("share_predictions is a scoring session's setting")
        if self.online and self.kind != "scoring":
            raise ValueError("online is a scoring session's setting")
        if self.request_signature is not None and (self.kind != "scoring" or self.online):
            raise ValueError("request_signature is a request session's setting")
        if self.scoring_pass != "all-nodes" and self.kind != "scoring":
            raise ValueError("scoring_pass is a scoring session's setting")
        if self.model_kind != "training" and self.kind != "scoring":
            raise ValueError("model_kind is a scoring session's setting")
        if self.model_kind == "release" and (
            self.privacy is None or self.scoring_pass != "all-nodes"
        ):
            # an online session's requests are such passes too, over the asked nodes
            # (service/online.py): no sampled pass, whose rows would be neighbourhoods
            raise ValueError(
                "a scoring session of a kept release (model_kind 'release') needs privacy and "
                "runs one pass over its nodes' kept rows (an online session's requests: the "
                "asked nodes'): no sampled pass"
            )
        if self.kind == "release" and (self.privacy is None or len(self.agg_layers) != 1):
            raise ValueError(
                "a release session (the private sign design) needs privacy and one aggregation"
                " layer, its release"
            )
        if self.secure_aggregation == "masks":
            check_masks(clients=self.clients, encryption=self.encryption)
        if self.stragglers == "continue":
            if self.clients < 3:
                raise ValueError(
                    "stragglers 'continue' needs 3 clients or more: a layer is aggregated over 2"
                    " clients at least, so with 2 it would wait for both anyway"
                )
            if self.privacy is not None and self.privacy.shared_noise:
                raise ValueError(
                    "stragglers 'continue' needs unshared noise: with shared_noise each share"
                    " carries 1/M of the noise, so a sum over fewer clients would carry less"
                    " than the ledger counts"
                )
            if self.privacy is not None and self.privacy.split_noise:
                raise ValueError(SPLIT_NOISE_NEEDS_WAIT)
        return self

    @property
    def encoding(self) -> ShareEncoding:
        if self.secure_aggregation == "masks":
            return "bfv-masked"
        return "ckks" if self.encryption == "ckks" else "float32"


#: Why split noise refuses stragglers "continue", masked or not.
SPLIT_NOISE_NEEDS_WAIT = (
    "stragglers 'continue' needs unsplit noise: each client adds sigma^2/(M-1), so a pass that"
    " goes on over fewer than the session's M clients would carry less noise than the ledger"
    " counts (--no-split-noise keeps each client's full noise)"
)


def check_masks(*, clients: int, encryption: str) -> None:
    """ValueError (one sentence) unless masked secure aggregation can run: 3 clients or more,
    encrypted."""
    if clients < 3:
        raise ValueError(
            "secure aggregation 'masks' needs 3 clients or more: with 2 the sum tells each "
            "client the other's share, masked or not"
        )
    if encryption != "ckks":
        raise ValueError(
            "secure aggregation 'masks' needs encryption: masked shares travel encrypted under "
            "BFV, and encryption 'none' sends plaintext"
        )


class SessionCreated(ResponseModel):
    session_id: str
    client_tokens: list[str] = Field(description="One bearer token per client, index = position.")
    passes_total: int
    noise_multiplier: float | None = Field(description="The z in use (given or calibrated).")


class SessionConfigView(ResponseModel):
    """The session's configuration without the node lists (see their counts instead)."""

    kind: SessionKind = "training"
    model_session: str | None = None
    model_kind: ModelKind = "training"
    clients: int
    layers: int
    agg_layers: list[AggLayer]
    stale: int
    rounds: int
    eval_every: int
    batch_size: int
    fanout: int
    num_nodes: int
    train_nodes_count: int
    eval_nodes_count: int
    seed: int
    encryption: Literal["ckks", "none"]
    secure_aggregation: SecureAggregation = "none"
    encoding: ShareEncoding
    public_context_sha256: str | None = Field(
        description="SHA-256 of the CKKS public context the session was created under."
    )
    privacy: PrivacySettings | None
    nodes: AlignedNodes
    label_holder: int | None
    stragglers: StragglerPolicy
    straggler_wait_seconds: float
    part_values: int = Field(
        PART_VALUES,
        ge=1,
        le=MAX_PART_VALUES,
        description="Values per part of a share (rows per part: max(1, part_values // columns)),"
        " sized by the service to its body limit.",
    )
    backbone: str | None = None
    worker_defaults: dict[str, bool | int | float | str] | None = None
    ready_gate: bool = False
    share_predictions: SharePredictions = "none"
    scoring_pass: ScoringPass = "all-nodes"
    online: bool = False
    request_signature: RequestSignature | None = None
    label: str | None
    partners: list[str] | None = None
    operator: str | None = None


#: Session ids are hex (uuid4): a request session's id ``<online id>-<n>`` is unambiguous
REQUEST_SEPARATOR = "-"


def request_session_id(online_id: str, number: int) -> str:
    """The session that answers request ``number`` (1, 2, ...) of online session ``online_id``."""
    return f"{online_id}{REQUEST_SEPARATOR}{number}"


def online_session_of(session_id: str) -> str | None:
    """The online session a request session belongs to (None for any other id)."""
    online_id, separator, number = session_id.rpartition(REQUEST_SEPARATOR)
    return online_id if separator and number.isdigit() else None


class ScoringRequest(StrictModel):
    """``POST /v1/sessions/{id}/requests``: the aligned nodes an online session scores now."""

    nodes: NodeList = Field(
        description="Aligned node ids (of the online session's `eval_nodes`), encoded like "
        "`eval_nodes` or a JSON list."
    )

    signature: RequestSignature | None = Field(
        None,
        description="The answering party's signature of this request (`glasu ask --signing-key`):"
        " kept with the request session for the workers to check; a worker whose owner pinned "
        "the answering party's key refuses a request without it.",
    )

    @field_validator("nodes")
    @classmethod
    def _one_node_at_least(cls, nodes: np.ndarray) -> np.ndarray:
        return one_node_at_least(nodes, "a request scores")


class ScoringRequestOpened(ResponseModel):
    request: int = Field(description="The request's number in its online session (1, 2, ...).")
    session_id: str = Field(
        description="The scoring session that answers it (`GET /v1/sessions/{session_id}`): "
        "the online session's workers run it with their tokens of the online session."
    )


class SessionSummary(ResponseModel):
    session_id: str
    label: str | None
    state: SessionStateName
    created_at: float
    clients: int
    passes_total: int
    current_pass: int
