"""``serve(settings)``: run the service under uvicorn (``glasu serve``)."""

from __future__ import annotations

import logging

import uvicorn

from secure.protocol import is_loopback_host
from service.app import create_app
from service.settings import ServiceSettings

logger = logging.getLogger("glasu.service")

#: TLS 1.2 suites: ephemeral key exchange and AEAD only (no CBC); TLS 1.3 has only AEAD suites.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def serve(settings: ServiceSettings) -> None:
    """Blocks until the server stops. One process only: long-poll wake-ups are in memory and the
    SQLite database has a single writer."""
    app = create_app(settings)
    tls = settings.tls_certfile is not None
    if not tls and not is_loopback_host(settings.host):
        logger.warning(
            "serving plain HTTP on %s: bearer tokens and payload metadata travel unencrypted;"
            " set GLASU_TLS_CERTFILE and GLASU_TLS_KEYFILE or terminate TLS in front",
            settings.host,
        )
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        ssl_certfile=str(settings.tls_certfile) if settings.tls_certfile else None,
        ssl_keyfile=str(settings.tls_keyfile) if settings.tls_keyfile else None,
        ssl_ciphers=TLS12_CIPHERS,
        server_header=False,
        workers=1,
        timeout_graceful_shutdown=5,  # a worker behind a dead link must not hold a stop
    )
