"""The worker's settings: environment variables ``GLASU_<FIELD>`` or ``glasu worker`` flags
(``--foo-bar`` is field ``foo_bar``), one model for both, so a container is configured like a
command."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GLASU_", extra="ignore")

    server: str = Field(description="Base URL of the aggregation service, e.g. https://host:8443")
    session: str = Field(description="Session id (from the operator).")
    client: int = Field(ge=0, description="This organisation's client index m.")
    token_file: Path = Field(description="File holding this client's bearer token.")
    data: Path = Field(description="This client's partition directory (see `glasu partition`).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where to train.")
    secret_context: Path | None = Field(
        None,
        description="CKKS secret context (from `glasu keygen`); required when the session "
        "is encrypted.",
    )
    ca_file: Path | None = Field(
        None, description="CA certificate that signed the service's TLS certificate."
    )
    backbone: Literal["gcnii", "gcn", "gat"] = Field("gcnii", description="Local graph layers.")
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
    seed: int | None = Field(None, description="Initialisation seed (default: the session's).")
    noise_seed: int | None = Field(
        None, description="Fix the DP noise for reproducibility (default: cryptographic seed)."
    )
    threads: int = Field(1, ge=1, description="CPU threads (the matrices are small: 1 is fastest).")
    result: Path | None = Field(None, description="Write a JSON summary of this worker's run here.")
    poll_seconds: float = Field(30.0, gt=0, le=60, description="Long-poll wait per request.")
    peer_wait_seconds: float = Field(
        900.0,
        gt=0,
        description="How long to wait for the other clients at one step before "
        "giving up (exit code 5).",
    )
