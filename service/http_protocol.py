"""uvicorn's HTTP/1.1 protocol, with the one answer it makes without the app (a request head its
parser refuses: ``Content-Length: abc``, ``Content-Length: -5``, a garbled request line) sent
as an RFC 9457 problem document like every other error, instead of uvicorn's plain text.

Such a request never reaches the app (the parser fails before there is a request to hand it),
so the answer is written here, on the connection, which is then closed: what the parser read is
not a request whose end can be found. The protocol is the one uvicorn's ``auto`` would pick
(httptools where it is installed, else h11), with only ``send_400_response`` replaced.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from service.errors import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_BASE, TITLES

MALFORMED_SLUG = "bad-request"
MALFORMED_DETAIL = (
    "the request's head is not valid HTTP/1.1 (for example a Content-Length that is not a"
    " non-negative integer); the connection is closed"
)


def malformed_request_answer(default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The whole 400 response to a request head the parser refused: status line, headers (the
    server's defaults, the problem's type and length, ``Connection: close``) and body."""
    body = json.dumps(
        {
            "type": PROBLEM_TYPE_BASE + MALFORMED_SLUG,
            "title": TITLES[MALFORMED_SLUG],
            "status": 400,
            "detail": MALFORMED_DETAIL,
        }
    ).encode("ascii")
    head = [b"HTTP/1.1 400 Bad Request\r\n"]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head += [
        b"content-type: " + PROBLEM_MEDIA_TYPE.encode("ascii") + b"\r\n",
        b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
        b"connection: close\r\n\r\n",
    ]
    return b"".join(head) + body


class _ProblemAnswer:
    """Replaces uvicorn's ``send_400_response`` (both protocols call it, then return)."""

    server_state: ServerState
    transport: asyncio.Transport

    def send_400_response(self, msg: str) -> None:  # msg: uvicorn's plain-text sentence
        self.transport.write(malformed_request_answer(self.server_state.default_headers))
        self.transport.close()


class ProblemH11Protocol(_ProblemAnswer, H11Protocol):
    pass


def http_protocol() -> type[asyncio.Protocol]:
    """The protocol class for ``uvicorn.run(http=...)``: httptools' if it is installed (as
    uvicorn's ``auto`` would choose), else h11's, answering a malformed head with a problem."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed
        return ProblemH11Protocol

    class ProblemHttpToolsProtocol(_ProblemAnswer, HttpToolsProtocol):
        pass

    return ProblemHttpToolsProtocol
