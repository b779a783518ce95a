"""The served process (`glasu serve`, real sockets) under hostile traffic: the TLS suites it
offers, and what an unauthenticated body costs it (nothing: it is answered before it is sent)."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from service_testkit import ROOT, ServedProcess, admin, client_path, session_request, start_serve

DEV_CA = ROOT / "deploy" / "dev-ca.sh"

# TLS 1.2 suites with CBC (MAC-then-encrypt) an ECDSA certificate could negotiate.
CBC_SUITES = (
    "ECDHE-ECDSA-AES128-SHA256",
    "ECDHE-ECDSA-AES256-SHA384",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
)
AEAD_SUITES = (
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
)


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    out = tmp_path_factory.mktemp("tls")
    made = subprocess.run(
        ["sh", str(DEV_CA), str(out), "DNS:localhost", "IP:127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    return out


@pytest.fixture
def https_serve(tmp_path: Path, tls_dir: Path) -> Iterator[ServedProcess]:
    served = start_serve(tmp_path, tmp_path / "service.sqlite3", tls_dir=tls_dir)
    try:
        served.wait_healthy()
        yield served
    finally:
        served.stop()


def _handshake(
    served: ServedProcess, ca: Path, version: ssl.TLSVersion, suite: str | None = None
) -> str:
    """The suite negotiated over ``version`` by a client that offers only ``suite`` (TLS 1.2)
    or its default suites."""
    context = ssl.create_default_context(cafile=str(ca))
    context.minimum_version = context.maximum_version = version
    if suite is not None:
        context.set_ciphers(f"{suite}:@SECLEVEL=0")  # the client offers it, whatever its policy
    port = int(served.url.rsplit(":", 1)[1])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname="localhost") as tls,
    ):
        cipher = tls.cipher()
    assert cipher is not None
    return cipher[0]


def test_tls_offers_only_aead_suites(https_serve: ServedProcess, tls_dir: Path) -> None:
    ca = tls_dir / "ca.crt"
    for suite in CBC_SUITES:
        with pytest.raises(ssl.SSLError):
            _handshake(https_serve, ca, ssl.TLSVersion.TLSv1_2, suite)
    for suite in AEAD_SUITES:
        assert _handshake(https_serve, ca, ssl.TLSVersion.TLSv1_2, suite) == suite
    assert _handshake(https_serve, ca, ssl.TLSVersion.TLSv1_3).startswith("TLS_")


@pytest.fixture
def http_serve(tmp_path: Path) -> Iterator[ServedProcess]:
    served = start_serve(tmp_path, tmp_path / "service.sqlite3")
    try:
        served.wait_healthy()
        yield served
    finally:
        served.stop()


def _headers_only(served: ServedProcess, request: bytes) -> bytes:
    """Send a request's head and none of its body; the whole answer (its head and the
    Content-Length bytes of its body). The service then waits a few seconds for the body it
    would discard before it closes (service/limits.py): not awaited here."""
    port = int(served.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer) < _answer_length(answer):
            chunk = sock.recv(65536)
            assert chunk, answer[:200]
            answer += chunk
        return answer


def _answer_length(answer: bytes) -> int:
    head, _, _ = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    raise AssertionError(f"no Content-Length in {head!r}")


def test_an_unauthenticated_body_is_answered_before_it_is_sent(http_serve: ServedProcess) -> None:
    """The service answers 401, with Connection: close, on the request head alone: it reads
    (and parses) none of the 8 MiB the request announces before it answers."""
    size = 8 * 2**20
    created = httpx.post(f"{http_serve.url}/v1/sessions", json=session_request(), headers=admin())
    upload = f"{client_path(created.json()['session_id'], 0)}/passes/0/layers/1/nodes"
    for method, path, media_type in (
        ("POST", "/v1/sessions", "application/json"),
        ("PUT", upload, "application/octet-stream"),
    ):
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer not-the-token-0123456789\r\n"
            f"Content-Type: {media_type}\r\nContent-Length: {size}\r\n\r\n"
        )
        answer = _headers_only(http_serve, head.encode())
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 401 Unauthorized", answer[:200]
        assert b"connection: close" in rest.lower()
    assert httpx.get(f"{http_serve.url}/healthz").status_code == 200
