"""Service configuration: environment variables ``GLASU_<FIELD>`` or keyword arguments.

The CLI builds ``ServiceSettings(**overrides)`` from its flags, where flag ``--foo-bar`` is field
``foo_bar`` and environment variable ``GLASU_FOO_BAR``. There is no default admin token: the
service refuses to start without one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, FilePath, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_ADMIN_TOKEN_LENGTH = 16
MAX_LONG_POLL_SECONDS = 60.0
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
TOKEN_HINT = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GLASU_", extra="forbid")

    database: Path | str = Field(
        Path("./glasu-service.sqlite3"),
        description="Where sessions, tokens, round progress and the privacy ledger live: an SQLite"
        " file (one process), or a postgresql://user@host/dbname URL (replicas share it).",
    )
    admin_token: SecretStr | None = Field(
        None, description="Bearer token for the admin routes (or use admin_token_file)."
    )
    admin_token_file: FilePath | None = Field(
        None, description="File whose content (stripped) is the admin token, e.g. a mounted secret."
    )
    public_context: FilePath | None = Field(
        None,
        description="CKKS *public* context (from `glasu keygen`). Without it, sessions with"
        " encryption 'ckks' are refused. A context holding a secret key stops the service.",
    )
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1, description="Largest request body.")
    max_json_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1,
        description="Largest JSON body of a session creation, whose encoded node lists grow with"
        " the graph (about 1 bit per node each: 16 MiB holds two lists of about 50M nodes); the"
        " other JSON routes take at most 64 KiB.",
    )
    max_inflight_body_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1,
        description="Bytes of large request bodies (over 64 KiB) the service holds at once,"
        " counted by their Content-Length from before they are read until they are processed;"
        " a body beyond it waits its turn up to body_queue_seconds, then gets 503 with"
        " Retry-After. A body larger than this takes all of it.",
    )
    body_queue_seconds: float = Field(
        10.0,
        ge=0.0,
        le=MAX_LONG_POLL_SECONDS,
        description="How long a large body waits for max_inflight_body_bytes before a 503.",
    )
    long_poll_seconds: float = Field(
        30.0,
        ge=0.0,
        le=MAX_LONG_POLL_SECONDS,
        description="Default and maximum wait of the long-poll downloads.",
    )
    score_foreign_models: bool = Field(
        False,
        description="Accept a scoring session whose model_session this service never ran (the"
        " one-machine `glasu score` starts a fresh service for models trained on another); each"
        " worker still refuses a model of another session. Off: the model_session must be a"
        " training session of this service that is over, of the same clients and layers.",
    )
    host: str = Field("127.0.0.1", description="Interface to bind (0.0.0.0 in a container).")
    port: int = Field(8000, ge=0, le=65535)
    tls_certfile: FilePath | None = Field(None, description="PEM certificate; enables HTTPS.")
    tls_keyfile: FilePath | None = Field(None, description="PEM private key of tls_certfile.")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"

    _resolved_admin_token: str = PrivateAttr(default="")

    @field_validator("database", mode="before")
    @classmethod
    def _database_path_or_url(cls, value: Any) -> Path | str:
        """A ``postgresql://`` (or ``postgres://``) URL stays a string; anything else is a
        path."""
        text = str(value)
        return text if text.startswith(POSTGRES_SCHEMES) else Path(value)

    def __init__(self, **values: Any) -> None:
        # An admin token given explicitly (a CLI flag) replaces one from the environment, even
        # when the environment names the other kind (GLASU_ADMIN_TOKEN vs ..._FILE).
        for given, other in (
            ("admin_token", "admin_token_file"),
            ("admin_token_file", "admin_token"),
        ):
            if values.get(given) is not None and other not in values:
                values[other] = None
        super().__init__(**values)

    @model_validator(mode="after")
    def _resolve_admin_token(self) -> ServiceSettings:
        if self.admin_token is not None and self.admin_token_file is not None:
            raise ValueError(
                "set only one of admin_token (GLASU_ADMIN_TOKEN) and admin_token_file"
                " (GLASU_ADMIN_TOKEN_FILE)"
            )
        if self.admin_token is not None:
            token = self.admin_token.get_secret_value().strip()
            source = "admin_token"
        elif self.admin_token_file is not None:
            token = self.admin_token_file.read_text(encoding="utf-8").strip()
            source = f"admin_token_file {self.admin_token_file}"
        else:
            raise ValueError(
                "an admin token is required: set GLASU_ADMIN_TOKEN or GLASU_ADMIN_TOKEN_FILE"
                f" (flags --admin-token / --admin-token-file); {TOKEN_HINT}"
            )
        if len(token) < MIN_ADMIN_TOKEN_LENGTH:
            raise ValueError(
                f"the admin token from {source} is shorter than {MIN_ADMIN_TOKEN_LENGTH}"
                f" characters; {TOKEN_HINT}"
            )
        self._resolved_admin_token = token
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> ServiceSettings:
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("tls_certfile and tls_keyfile must be given together")
        return self

    @property
    def database_url(self) -> str | None:
        """The PostgreSQL URL, or None for an SQLite file."""
        return self.database if isinstance(self.database, str) else None

    @property
    def database_path(self) -> Path | None:
        """The SQLite file, or None for PostgreSQL."""
        return self.database if isinstance(self.database, Path) else None

    @property
    def admin_token_value(self) -> str:
        """The admin token, whichever way it was given."""
        return self._resolved_admin_token
