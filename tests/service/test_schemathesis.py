"""Schema-based fuzzing of the live app (Schemathesis, in process): for every operation of the
OpenAPI schema, generated requests never cause a server error, and every response conforms to
the schema (status codes, content types, headers, bodies). Short here; `bench/fuzz_api.py` runs
the same with many more examples.

Excluded: Schemathesis's "schema-valid request accepted" check. Some rules span several fields
(a privacy object needs `noise_multiplier` or `epsilon`; node ids lie below `num_nodes`;
aggregation layers below `layers`, and only layer 1 under privacy) and are described in the
schema's descriptions, not expressible as JSON Schema constraints, so a schema-valid request can
rightly be refused with 422.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from service.app import create_app
from service.settings import ServiceSettings

EXAMPLES = int(os.environ.get("API_FUZZ_EXAMPLES", "15"))
TOKEN = "fuzz-admin-token-0123456789abcdef"

_app = create_app(
    ServiceSettings(
        database=Path(tempfile.mkdtemp(prefix="glasu-fuzz-")) / "service.sqlite3",
        admin_token=TOKEN,
        long_poll_seconds=0.1,
    )
)


async def _without_lifespan(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Schemathesis opens and closes the app around every call; the app's lifespan would close
    its database after the first one."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
                continue
            await send({"type": "lifespan.shutdown.complete"})
            return
    await _app(scope, receive, send)


schema = schemathesis.openapi.from_asgi("/openapi.json", _without_lifespan)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_error_and_every_response_conforms(case: schemathesis.Case) -> None:
    # the token replaces the generated one only where the case sends one: a negative case that
    # drops the Authorization header on purpose must be refused (401), not let in
    if "Authorization" in (case.headers or {}):
        case.headers = {**case.headers, "Authorization": f"Bearer {TOKEN}"}
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
