"""Container health check for `glasu serve`: GET /healthz on this container's port.

Reads the same GLASU_* variables as the service (GLASU_PORT, GLASU_TLS_CERTFILE). The check
talks to 127.0.0.1 inside the container, so it does not verify the certificate's name: it only
asks whether this process answers. Exit 0 healthy, 1 not. Standard library only."""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.request


def main() -> int:
    port = int(os.environ.get("GLASU_PORT", "8000"))
    tls = bool(os.environ.get("GLASU_TLS_CERTFILE"))
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/healthz"
    context = ssl._create_unverified_context() if tls else None  # loopback liveness only
    try:
        with urllib.request.urlopen(url, timeout=4, context=context) as response:
            body = json.load(response)
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    if body.get("status") != "ok":
        print(f"unhealthy: {url}: {body}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
