"""OpenAPI fragments shared by the routers (binary bodies and problem-details errors)."""

from __future__ import annotations

from typing import Any

from service.errors import PROBLEM_MEDIA_TYPE

OCTET_STREAM = "application/octet-stream"

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
    },
}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {PROBLEM_MEDIA_TYPE: {"schema": PROBLEM_SCHEMA}}}


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _problem("Missing or invalid bearer token (unauthorized)."),
    403: _problem("Token not allowed on this route (forbidden)."),
    404: _problem("Unknown session, pass or layer."),
    409: _problem("State conflict: wrong pass, occupied slot, closed session, budget exhausted."),
    413: _problem("Body larger than GLASU_MAX_BODY_BYTES."),
    422: _problem("Invalid request (validation-error, wrong-shape, wrong-encoding, bad-payload)."),
}

BINARY_REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {OCTET_STREAM: {"schema": {"type": "string", "format": "binary"}}},
    }
}


def binary_response(description: str, *, with_count: bool) -> dict[str, Any]:
    headers: dict[str, Any] = {
        "X-Glasu-Shape": {"description": "'n' or 'rows,cols'", "schema": {"type": "string"}},
        "X-Glasu-Encoding": {"description": "int64, float32 or ckks", "schema": {"type": "string"}},
    }
    if with_count:
        headers["X-Glasu-Count"] = {
            "description": "How many shares were added (M).",
            "schema": {"type": "integer"},
        }
    return {
        "description": description,
        "content": {OCTET_STREAM: {"schema": {"type": "string", "format": "binary"}}},
        "headers": headers,
    }
