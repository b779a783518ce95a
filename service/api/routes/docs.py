"""OpenAPI fragments shared by the routers (binary bodies and problem-details errors)."""

from __future__ import annotations

from typing import Any

from secure.wire.headers import COUNT_HEADER, ENCODING_HEADER, SHAPE_HEADER
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
    400: _problem(
        f"Malformed header: Content-Length, {SHAPE_HEADER} or {ENCODING_HEADER} (bad-header)."
    ),
    401: _problem("Missing or invalid bearer token (unauthorized)."),
    403: _problem("Token not allowed on this route (forbidden)."),
    404: _problem("Unknown session, pass or layer."),
    409: _problem("State conflict: wrong pass, occupied slot, closed session, budget exhausted."),
    413: _problem("Body larger than GLASU_MAX_BODY_BYTES."),
    415: _problem("Body of another media type than the route takes (JSON or octet-stream)."),
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
        SHAPE_HEADER: {"description": "'n' or 'rows,cols'", "schema": {"type": "string"}},
        ENCODING_HEADER: {"description": "int64, float32 or ckks", "schema": {"type": "string"}},
    }
    if with_count:
        headers[COUNT_HEADER] = {
            "description": "How many shares were added (M).",
            "schema": {"type": "integer"},
        }
    return {
        "description": description,
        "content": {OCTET_STREAM: {"schema": {"type": "string", "format": "binary"}}},
        "headers": headers,
    }


#: Headers every binary upload must carry. The routes read them as optional so that a missing
#: one is a 400 bad-header naming it (the protocol's own error), not a generic 422; the schema
#: still says they are required.
REQUIRED_UPLOAD_HEADERS = (SHAPE_HEADER, ENCODING_HEADER)


def mark_required_headers(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI schema with the upload headers marked required."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if "requestBody" not in operation:
                continue
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "header" and parameter["name"] in REQUIRED_UPLOAD_HEADERS:
                    parameter["required"] = True
                    parameter["schema"] = {"type": "string"}
    return schema
