"""``serve(settings)``: run the service under uvicorn (``glasu serve``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import socket
import sys

import uvicorn

from secure.protocol import is_loopback_host
from service.app import create_app
from service.http_protocol import http_protocol
from service.settings import ServiceSettings

logger = logging.getLogger("glasu.service")

#: TLS 1.2 suites: ephemeral key exchange and AEAD only (no CBC); TLS 1.3 has only AEAD suites.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


#: glibc's mallopt parameter, and the size from which a block is mapped on its own.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20


def return_large_blocks_to_the_system() -> bool:
    """Have glibc map every block of 1 MiB or more on its own, so that freeing it gives it back
    to the system. By default glibc raises that threshold to the size of the largest block freed
    so far (up to 32 MiB): after the first large request body, bodies, shares and sums of up to
    32 MiB are carved from the heaps of the threads that handled them, and a heap gives back
    only its top, so each of the server's threads kept tens of MiB after the requests were
    gone (bench/replica_memory.py, docs/results.md). Setting the threshold fixes it. Whether
    it could be set (glibc only)."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False


def check_can_listen(host: str, port: int) -> None:
    """Raise :class:`OSError` (one sentence) when the service could not listen on ``host:port``
    (another process listens there, a port the user may not bind), before anything is created:
    uvicorn would say it only after the app had opened (and made) its database, in log lines.
    Each address the host resolves to is bound as uvicorn binds it (SO_REUSEADDR), then freed."""
    if port == 0:  # any free port: nothing to check
        return
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # not a name this machine resolves: uvicorn's own error says so
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    continue  # a family this machine has not enabled: asyncio skips it too
                why = (
                    "another process listens there: stop it or give another --port"
                    if exc.errno == errno.EADDRINUSE
                    else exc.strerror
                )
                raise OSError(exc.errno, f"cannot listen on {host}:{port} ({why})") from None


def serve(settings: ServiceSettings) -> None:
    """Blocks until the server stops. One process per ``glasu serve``: on SQLite (the embedded
    default) it is the database's only writer, and its long polls are woken in memory. To scale
    out, run several ``glasu serve`` replicas on one PostgreSQL database behind a load balancer
    (no stickiness needed: no state that matters lives in a process; long polls are woken across
    replicas by LISTEN/NOTIFY), not uvicorn workers in one replica."""
    check_can_listen(settings.host, settings.port)
    return_large_blocks_to_the_system()
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
        http=http_protocol(),  # a head its parser refuses is answered with a problem too
        workers=1,
        timeout_graceful_shutdown=5,  # a worker behind a dead link must not hold a stop
    )
