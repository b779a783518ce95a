"""The body of ``GET /v1/sessions/{id}``: a session's settings, progress, metrics, traffic and
privacy report, as the operator and each worker read it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from secure.accounting import AccountantName
from secure.wire.common import ResponseModel
from secure.wire.sessions import SessionConfigView, SessionStateName


class LayerProgress(ResponseModel):
    layer: int
    width: int
    rows: int | None = Field(description="Rows of this layer in the pass, once known.")
    nodes_received: list[int] | None = Field(
        description="Clients whose node set arrived (null for the top layer, whose rows are the"
        " output nodes)."
    )
    union_ready: bool
    embeddings_received: list[int]
    aggregated: bool


class PassProgress(ResponseModel):
    pass_index: int = Field(alias="pass")
    kind: Literal["train", "eval"]
    round: int
    layers: list[LayerProgress]
    absent: list[int] = Field(
        default_factory=list,
        description="Clients this pass does not wait for: left out of an earlier pass and not"
        " rejoined yet (stragglers 'continue').",
    )


class MetricsRecord(ResponseModel):
    pass_index: int = Field(alias="pass")
    kind: Literal["train", "eval"]
    round: int
    reports: int = Field(description="How many clients reported; values are their mean.")
    loss: float | None
    val_accuracy: float | None
    test_accuracy: float | None
    train_accuracy: float | None


class ClientTraffic(ResponseModel):
    client: int
    bytes_up: int
    bytes_down: int


class LedgerEntry(ResponseModel):
    release: int = Field(description="1-based release number.")
    pass_index: int = Field(alias="pass")
    epsilon: float = Field(description="Cumulative epsilon after this release.")
    released_at: float
    clients: list[int] = Field(
        description="The clients whose shares the released sum holds (all of them unless a"
        " pass went on without a straggler)."
    )


class ClientReleases(ResponseModel):
    client: int
    releases: int = Field(description="Releases that held this client's share.")
    epsilon: float = Field(description="Epsilon of this client's own releases.")


class AdversaryEpsilon(ResponseModel):
    adversary: str
    noise_multiplier: float | None = Field(
        description="The z this adversary faces; null when it sees no release."
    )
    epsilon: float | None = Field(description="Epsilon against it so far (null: nothing seen).")
    epsilon_planned: float | None = Field(description="After every planned release.")
    note: str
    key: str | None = Field(
        None,
        description="'service', 'peer', 'service_peer' (split noise), 'colluding' or 'group' (the"
        " unit of all M rows).",
    )


class PrivacyReport(ResponseModel):
    """Without privacy: ``enabled`` false, no releases, nulls elsewhere."""

    enabled: bool
    epsilon: float | None = Field(None, description="Epsilon spent so far.")
    delta: float | None = None
    noise_multiplier: float | None = Field(None, description="z the clients use for the sum.")
    noise_multiplier_source: Literal["given", "calibrated"] | None = None
    ledger_noise_multiplier: float | None = Field(
        None,
        description="z the ledger accounts with: z, or z*sqrt((M-1)/M) with shared noise (one"
        " curious peer subtracts its own share).",
    )
    sensitivity: float | None = Field(
        None, description="Delta of one client's release, derived from clip and occurrence_cap."
    )
    clip: float | None = None
    noise_std: float | None = Field(None, description="z * sensitivity, per coordinate of the sum.")
    releases: int = 0
    max_releases: int | None = None
    accountant: AccountantName | None = None
    epsilon_target: float | None = None
    epsilon_planned: float | None = Field(None, description="Epsilon after every planned release.")
    shared_noise: bool | None = None
    split_noise: bool | None = Field(
        None, description="Split discrete Gaussian noise (docs/privacy.md section 11)."
    )
    split: dict[str, Any] | None = Field(
        None,
        description="Split noise: ``secure.split_noise.AdversaryEpsilons.to_dict`` (clients,"
        " releases, delta, accountant, and each adversary's noise multiplier and epsilon).",
    )
    adversary_lines: list[str] = Field(
        default_factory=list,
        description="Split noise: epsilon against each adversary by Kairouz et al.'s bound, one"
        " line each (empty otherwise).",
    )
    occurrence_cap: int | None = None
    release: str | None = Field(
        None, description="'clip-after' or 'degree-normalised' (docs/privacy.md 3.7)."
    )
    degree_floor: int | None = Field(
        None, description="d_min of a degree-normalised release (null otherwise)."
    )
    privacy_unit: str | None = Field(None, description="What one unit of privacy protects.")
    not_protected: list[str] = Field(
        default_factory=list, description="What the mechanism does not hide."
    )
    adversaries: list[AdversaryEpsilon] = Field(
        default_factory=list,
        description="Epsilon against each adversary; `epsilon` above is the ledger's (one curious"
        " peer with shared noise, all other peers colluding without).",
    )
    ledger: list[LedgerEntry] = Field(default_factory=list)
    by_client: list[ClientReleases] = Field(
        default_factory=list,
        description="Per client, what it actually released; differs from `releases` only when"
        " passes went on without a client (stragglers 'continue').",
    )


class ClientReadiness(ResponseModel):
    client: int
    state: Literal["ready", "refused", "waiting"] = Field(
        description="What the client said at join: ready, refused (the session is then closed),"
        " or nothing yet."
    )
    reason: str | None = Field(None, description="Why it refused (its worker's sentence).")
    reported_at: float | None = Field(None, description="When it said so (Unix time).")


class SessionStatus(ResponseModel):
    session_id: str
    label: str | None
    state: SessionStateName
    created_at: float
    config: SessionConfigView
    max_body_bytes: int | None = Field(
        None,
        description="The service's body limit (GLASU_MAX_BODY_BYTES): `config.part_values` fits"
        " it (null: an older service).",
    )
    passes_total: int
    current_pass: int
    progress: PassProgress | None = Field(description="The current pass (null once over).")
    metrics: list[MetricsRecord]
    bytes_up: int
    bytes_down: int
    traffic: list[ClientTraffic]
    privacy: PrivacyReport
    readiness: list[ClientReadiness] | None = Field(
        None,
        description="A session with `ready_gate`: each client's answer at join, by client "
        "(null without the gate).",
    )
