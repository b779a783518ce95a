"""The worker's settings: ``glasu worker`` flags, environment variables ``GLASU_<FIELD>`` and a
TOML settings file (``--settings-file``), in that order of precedence (``--foo-bar`` is field
``foo_bar`` is ``GLASU_FOO_BAR`` is ``foo_bar = ...`` in the file), one model for all, so a
container is configured like a command. The privacy policy fields are the data owner's: they
bound what any session may spend of this data (``clients/policy.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from clients.cores import available_cores
from clients.policy import PrivacyPolicy
from models.config import DEFAULT_HOPS, DEVICE_NAMES, BackboneName, FeatureScaleName
from secure.accounting import AccountantName
from secure.protocol import is_loopback_host


def plain_http_off_loopback(server: str) -> bool:
    """``server`` is a plain-HTTP address other than loopback: tokens and shares would cross a
    network without TLS (refused unless ``--insecure-http``)."""
    url = urlsplit(server)
    return url.scheme == "http" and not is_loopback_host(url.hostname or "")


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GLASU_", extra="ignore")

    settings_file: Path | None = Field(
        None,
        description="TOML file with any of these settings (field names as keys); flags and "
        "environment variables win over it.",
    )

    server: str = Field(description="Base URL of the aggregation service, e.g. https://host:8443")
    session: str = Field(description="Session id (from the operator).")
    client: int = Field(ge=0, description="This organisation's client index m.")
    token_file: Path = Field(description="File holding this client's bearer token.")
    data: Path = Field(
        description="This client's folder: from `glasu partition`, or from `glasu prepare` "
        "aligned by `glasu align run` (docs/data.md)."
    )
    device: str = Field(
        "auto",
        description="Where to train: auto (a GPU if present), cpu, cuda or cuda:N (one GPU "
        "per worker when several share a host). CKKS always runs on the CPU.",
    )
    secret_context: Path | None = Field(
        None,
        description="CKKS secret context (from `glasu keygen`); required when the session "
        "is encrypted. In a session with masked secure aggregation: the BFV one (`glasu keygen "
        "--scheme bfv`), with --masking-key and --masking-peer-keys.",
    )
    masking_key: Path | None = Field(
        None,
        description="This organisation's X25519 masking key (masking.key of `glasu keygen "
        "--masking-key`): a session with masked secure aggregation needs it.",
    )
    masking_peer_keys: str | None = Field(
        None,
        description="The other organisations' public masking keys, pinned by client index, "
        "received out of band: M=PATH,M=PATH (one per other client).",
    )
    ca_file: Path | None = Field(
        None, description="CA certificate that signed the service's TLS certificate."
    )
    backbone: BackboneName | None = Field(
        None,
        description="Local graph layers; sign: the features propagated --hops hops over this "
        "party's own graph before training, then an MLP (not under differential privacy). "
        "Default: the session's (the backbone `glasu session create --backbone` chose its "
        "settings for; a worker given another refuses the session), gcnii where it names none.",
    )
    hops: int = Field(
        DEFAULT_HOPS, ge=0, description="Hops of the sign backbone's precomputed propagation."
    )
    feature_scale: FeatureScaleName = Field(
        "auto",
        description="How the sign backbone scales this party's propagated columns: column "
        "(standardised), hop (one number per hop), auto (hop for a sparse table, more than half "
        "zeros; column otherwise). Measured on this party's own table, kept with its model.",
    )
    hidden: int | None = Field(
        None,
        ge=1,
        description="Hidden width of the local layers (default: the session's "
        "aggregation width; 128 under differential privacy).",
    )
    dropout: float = Field(0.5, ge=0.0, lt=1.0)
    lr: float = Field(0.01, gt=0.0)
    weight_decay: float = Field(5e-4, ge=0.0)
    eval_fanout: int = Field(10, ge=1, description="Neighbours per node in evaluation passes.")
    cache_rounds: int = Field(
        1,
        ge=1,
        description="Rounds of stale statistics the local steps reuse round-robin (CELU-VFL; "
        "1: the round's own batch only).",
    )
    instance_weighting: bool = Field(
        False,
        description="Weight each instance of a local step by the cosine between its current "
        "and its cached output (CELU-VFL).",
    )
    weight_threshold: float = Field(
        0.5, ge=-1.0, le=1.0, description="cos(xi): instances less similar get weight 0."
    )
    seed: int | None = Field(None, description="Initialisation seed (default: the session's).")
    noise_seed: int | None = Field(
        None,
        description="Tests only: fix the DP noise (refused in a private session unless "
        "GLASU_TEST_REPRODUCIBLE_NOISE=1; the report then says NOT PRIVATE). Default: "
        "cryptographic noise.",
    )
    threads: int | Literal["auto"] = Field(
        "auto",
        description="CPU threads for torch: auto (the cores this process may use: its CPU "
        "affinity and container quota) or a number. The sparse products of a large graph "
        "scale with them; give several workers on one machine a share each.",
    )
    result: Path | None = Field(None, description="Write a JSON summary of this worker's run here.")
    poll_seconds: float = Field(30.0, gt=0, le=60, description="Long-poll wait per request.")
    peer_wait_seconds: float = Field(
        900.0,
        gt=0,
        description="How long to wait for the other clients at one step before "
        "giving up (exit code 5); raise it for graphs of millions of nodes, whose evaluation "
        "pass can take longer (docs/deploy.md).",
    )
    ledger: Path | None = Field(
        None,
        description="This organisation's privacy ledger (SQLite), where every release of its "
        "data is counted, in every session and flow. Default: the ledger of the organisation "
        "the --data folder names (glasu prepare), $XDG_DATA_HOME/glasu/ledgers/<organisation>"
        ".sqlite3, whichever copy of its data the folder is; in a folder without one (glasu "
        "partition), privacy-ledger.sqlite3 in it.",
    )
    checkpoint: Path | None = Field(
        None,
        description="Folder of this worker's checkpoints, written after every pass; a worker "
        "started again (after a crash) resumes from its checkpoint there. Default: "
        "checkpoints/ in the --data folder.",
    )
    no_checkpoint: bool = Field(
        False,
        description="Write no checkpoints (a worker that stops cannot then rejoin its session).",
    )
    model_out: Path | None = Field(
        None,
        description="Folder to keep this party's trained model in at the end of a training "
        "session (the best evaluation round's; `glasu model show DIR` describes it).",
    )
    model: Path | None = Field(
        None,
        description="A scoring session: the folder of this party's trained model (from "
        "--model-out or `glasu train --model-dir`).",
    )
    predictions: Path | None = Field(
        None,
        description="A scoring session, a party with a head: the file the predictions go to, "
        "one row per scored node of this party's own ids, in the order of its table (.csv or "
        ".parquet); with --online, the folder that gets one <request session>.csv per request.",
    )
    online: bool = Field(
        False,
        description="--session is an online scoring session (`glasu session create --score-with"
        " ... --online`): keep the model loaded and score each request of the answering party "
        'as it comes, until the session is closed (docs/data.md, "Online scoring").',
    )
    answering_party_key: str | None = Field(
        None,
        description="With --online: the answering party's public signing key (its "
        "alignment-signing.pub of `glasu align keygen`, pinned as for the alignment), by client "
        "index: M=PATH. The worker takes part only in requests that party signed (`glasu ask "
        "--signing-key`), each once, over the signed nodes.",
    )
    accept_unsigned_requests: bool = Field(
        False,
        description="With --online and no --answering-party-key: take part in every request "
        "session of the online session, signed or not (a service that deviates can then open "
        "requests nobody asked for, each a release in this organisation's ledger).",
    )
    request_max_age_seconds: float = Field(
        600.0,
        gt=0,
        description="With --answering-party-key: refuse a request signed longer ago (or "
        "further ahead, by this host's clock) than this.",
    )
    overwrite: bool = Field(
        False,
        description="Replace this party's model in --model-out and the --predictions file if "
        "they exist (without it the worker refuses them before it starts). Another party's "
        "model is never replaced.",
    )
    insecure_http: bool = Field(
        False,
        description="Allow a plain-HTTP service address other than loopback (tokens and "
        "shares then cross the network unprotected by TLS).",
    )
    # -- the data owner's privacy policy (clients/policy.py) -----------------------------------
    require_dp: bool = Field(True, description="Refuse sessions without differential privacy.")
    max_session_epsilon: float = Field(
        PrivacyPolicy.max_session_epsilon,
        gt=0,
        description="The most epsilon one session may spend of this data.",
    )
    max_lifetime_epsilon: float = Field(
        PrivacyPolicy.max_lifetime_epsilon,
        gt=0,
        description="The most epsilon all sessions together may spend of this data (the "
        "organisation's ledger, --ledger, counts them all).",
    )
    policy_delta: float = Field(
        PrivacyPolicy.delta,
        gt=0,
        lt=1,
        description="The delta at which this worker accounts its own epsilon.",
    )
    allow_shared_noise: bool = Field(
        False,
        description="Take part in sessions with shared noise (the guarantee then holds against "
        "one curious peer only, not against peers colluding).",
    )
    share_predictions: bool = Field(
        False,
        description="This organisation agrees to send its predictions to its partners when a "
        "scoring session asks (`glasu session create --share-predictions label-holder`) and it "
        "is the answering party (the label holder); without it, its worker refuses such a "
        "session before anything is released.",
    )
    policy_accountant: AccountantName = Field(
        PrivacyPolicy.accountant, description="The accountant of this worker's own ledger."
    )

    @field_validator("masking_peer_keys")
    @classmethod
    def _peer_keys_are_pairs(cls, text: str | None) -> str | None:
        if text is not None:
            parse_peer_keys(text)
        return text

    @field_validator("answering_party_key")
    @classmethod
    def _one_pinned_key(cls, text: str | None) -> str | None:
        if text is not None and len(parse_peer_keys(text)) != 1:
            raise ValueError("give the answering party's key as M=PATH (one party)")
        return text

    def pinned_answering_key(self) -> tuple[int, Path] | None:
        """``answering_party_key`` as (client index, public key file)."""
        if self.answering_party_key is None:
            return None
        return parse_peer_keys(self.answering_party_key)[0]

    def pinned_masking_keys(self) -> list[tuple[int, Path]]:
        """``masking_peer_keys`` as (client index, public key file) pairs."""
        return parse_peer_keys(self.masking_peer_keys or "")

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if not DEVICE_NAMES.fullmatch(device):
            raise ValueError(f"{device!r} is not auto, cpu, cuda or cuda:N")
        return device

    @field_validator("threads")
    @classmethod
    def _threads(cls, value: int | str) -> int | str:
        if value != "auto" and int(value) < 1:
            raise ValueError("threads is auto or a number of at least 1")
        return value

    def torch_threads(self) -> int:
        """The number of CPU threads ``threads`` stands for."""
        return available_cores() if self.threads == "auto" else int(self.threads)

    @model_validator(mode="after")
    def _tls_unless_loopback(self) -> WorkerSettings:
        if plain_http_off_loopback(self.server) and not self.insecure_http:
            raise ValueError(
                f"server {self.server} is plain HTTP on a network address: use https:// "
                "(with --ca-file), or pass --insecure-http to send tokens and shares "
                "unprotected"
            )
        return self

    def checkpoint_dir(self) -> Path | None:
        """Where the checkpoints go, or None with ``--no-checkpoint``."""
        if self.no_checkpoint:
            return None
        return self.checkpoint or self.data / "checkpoints"

    def policy(self) -> PrivacyPolicy:
        return PrivacyPolicy(
            require_dp=self.require_dp,
            max_session_epsilon=self.max_session_epsilon,
            max_lifetime_epsilon=self.max_lifetime_epsilon,
            delta=self.policy_delta,
            allow_shared_noise=self.allow_shared_noise,
            accountant=self.policy_accountant,
            share_predictions=self.share_predictions,
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init), then the environment, then the settings file if one is named by a
        flag or by ``GLASU_SETTINGS_FILE``."""
        named: Any = init_settings().get("settings_file") or env_settings().get("settings_file")
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        if named:
            path = Path(named)
            if not path.is_file():
                raise ValueError(f"settings file {path} not found")
            sources += (TomlConfigSettingsSource(settings_cls, toml_file=path),)
        return sources


def parse_peer_keys(text: str) -> list[tuple[int, Path]]:
    """``M=PATH,M=PATH`` as pairs; ValueError naming the item that is not ``M=PATH``, or a
    client given twice."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        party, equals, path = item.partition("=")
        if not equals or not party.strip().isdigit() or not path.strip():
            raise ValueError(f"give M=PATH,M=PATH (client indices and public keys), not {item!r}")
        pairs.append((int(party), Path(path.strip())))
    parties = [m for m, _ in pairs]
    if len(set(parties)) != len(parties):
        raise ValueError(f"a client's key is pinned twice in {text!r}")
    return pairs
